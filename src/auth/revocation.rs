//! Revocation across replicas: every replica on a PostgreSQL store listens on
//! the revocation channel and drops the cache entries a change affects.
//!
//! If the listening connection is lost, notifications sent meanwhile are lost
//! too: on every (re)connect the credential caches are flushed. While the
//! channel is not listening (it cannot connect or `LISTEN`, or `store.url`
//! reaches a transaction pooler and no `store.notify_url` gives it a session
//! of its own) the replica polls the store's audit events instead
//! ([`poll`]), so a change to a user or a key still reaches it within
//! [`POLL_INTERVAL`]; a logout, which writes no audit event, within the
//! cache TTL (`cache.ttl`). [`Channel`] says which, for `/readyz`.
//!
//! On SQLite there is no notification between processes: the server polls the
//! store's audit events ([`poll`]) every [`POLL_INTERVAL`], so a change the
//! command line makes reaches it within about a second, not at cache expiry.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::str::FromStr;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPoolOptions};
use tokio::sync::watch;
use uuid::Uuid;

use crate::auth::Authenticator;
use crate::auth::cache::Caches;
use crate::store::{REVOCATION_CHANNEL, Revocation, Store};
use crate::telemetry::Metrics;

/// Drops what a revocation affects from this replica's caches, then wakes
/// the open sockets holding an affected credential: they verify again (so
/// against the store's new state) and close if it died.
pub async fn apply(caches: &Caches, revocation: Revocation) {
    match revocation {
        Revocation::Key(id) => caches.invalidate_key_id(id),
        Revocation::User(id) => {
            caches.invalidate_user(id);
            caches.invalidate_sessions_of(id);
        }
        Revocation::Session(id) => caches.invalidate_session(id),
    }
    caches.live.revoked(&revocation);
}

/// Whether this replica hears the revocations other replicas make as they
/// are made (the channel listens), or polls for them: what `/readyz` says
/// beside "ready". Clones share one state.
#[derive(Debug, Clone)]
pub struct Channel {
    /// `None` while listening; else why not.
    deaf: Arc<Mutex<Option<String>>>,
    /// Polling is how this store works (SQLite): nothing to report.
    local: bool,
}

impl Channel {
    /// A PostgreSQL store's channel: not listening until it does.
    pub fn new() -> Channel {
        Channel {
            deaf: Arc::new(Mutex::new(Some("not connected yet".into()))),
            local: false,
        }
    }

    /// A channel that will not listen, and why.
    pub fn deaf(why: &str) -> Channel {
        Channel {
            deaf: Arc::new(Mutex::new(Some(why.to_owned()))),
            local: false,
        }
    }

    /// A SQLite store's: one replica, always polled.
    pub fn local() -> Channel {
        Channel {
            deaf: Arc::new(Mutex::new(None)),
            local: true,
        }
    }

    /// Whether notifications arrive; a SQLite store never listens.
    pub fn listening(&self) -> bool {
        !self.local && self.deaf.lock().is_ok_and(|deaf| deaf.is_none())
    }

    fn set(&self, deaf: Option<String>) {
        if let Ok(mut state) = self.deaf.lock() {
            *state = deaf;
        }
    }

    /// `/readyz`'s line about the channel when it is not listening.
    pub fn detail(&self) -> Option<String> {
        if self.local {
            return None;
        }
        let why = self.deaf.lock().ok()?.clone()?;
        Some(format!(
            "revocation channel: not listening ({why}); revocations made on other replicas \
             are polled every {} s",
            POLL_INTERVAL.as_secs()
        ))
    }
}

impl Default for Channel {
    fn default() -> Channel {
        Channel::new()
    }
}

/// Why a channel behind a transaction pooler without `store.notify_url`
/// does not listen.
pub const POOLER_WITHOUT_NOTIFY_URL: &str =
    "store.url reaches a transaction pooler and store.notify_url is not set";

/// Listens until shutdown, reconnecting with backoff.
/// `keygate_revocation_listener_up` is exported (at 0) as soon as this is
/// called: it exists only where a listener does.
pub fn listen(
    url: String,
    instance: Uuid,
    auth: Arc<Authenticator>,
    metrics: Arc<Metrics>,
    channel: Channel,
    shutdown: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send {
    metrics.init_revocation_listener();
    listen_until_shutdown(url, instance, auth, metrics, channel, shutdown)
}

async fn listen_until_shutdown(
    url: String,
    instance: Uuid,
    auth: Arc<Authenticator>,
    metrics: Arc<Metrics>,
    channel: Channel,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        match connect(&url, instance).await {
            Ok(mut listener) => {
                // Whatever was sent while no one listened is unknown: forget all.
                auth.caches().invalidate_all();
                channel.set(None);
                metrics.revocation_listener(true);
                tracing::info!("listening for revocations");
                backoff = Duration::from_millis(200);
                loop {
                    tokio::select! {
                        _ = shutdown.changed() => return,
                        received = listener.try_recv() => match received {
                            Ok(Some(notification)) => {
                                metrics.revocation_received();
                                match Revocation::parse(notification.payload()) {
                                    Some(revocation) => apply(auth.caches(), revocation).await,
                                    None => tracing::warn!(payload = notification.payload(), "ignored an unknown revocation"),
                                }
                            }
                            Ok(None) => {
                                tracing::warn!("revocation listener lost its connection; polling meanwhile");
                                channel.set(Some("its connection was lost".into()));
                                break;
                            }
                            Err(error) => {
                                tracing::warn!(%error, "revocation listener failed; polling meanwhile");
                                channel.set(Some(format!("it failed: {error}")));
                                break;
                            }
                        }
                    }
                }
            }
            Err(error) => {
                tracing::warn!(
                    %error,
                    "revocation listener cannot connect or LISTEN; revocations made on other \
                     replicas are polled every {} s until it does (behind a transaction \
                     pooler, set store.notify_url to a direct PostgreSQL URL)",
                    POLL_INTERVAL.as_secs()
                );
                channel.set(Some(format!("cannot connect or LISTEN: {error}")));
            }
        }
        metrics.revocation_listener(false);
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// How often a server on SQLite looks for changes made by another process.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Polls the store's audit events until shutdown, while `channel` is not
/// listening (always on SQLite): each change to a user or key written since
/// the last poll, by this process or another, is applied like a received
/// notification. When a poll fails, nothing is known of what happened
/// meanwhile: once the store answers again the credential caches are
/// flushed, as the PostgreSQL listener does on reconnecting; so too when
/// polling starts again after the channel listened.
pub async fn poll(
    store: Store,
    auth: Arc<Authenticator>,
    interval: Duration,
    channel: Channel,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut seen: Option<i64> = None;
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = ticks.tick() => {}
        }
        if channel.listening() {
            seen = None;
            continue;
        }
        let Some(after) = seen else {
            match store.last_audit_seq().await {
                Ok(last) => {
                    auth.caches().invalidate_all();
                    seen = Some(last);
                }
                Err(error) => tracing::warn!(%error, "polling for revocations failed"),
            }
            continue;
        };
        match store.revocations_after(after).await {
            Ok((last, revocations)) => {
                for revocation in revocations {
                    apply(auth.caches(), revocation).await;
                }
                seen = Some(last);
            }
            Err(error) => {
                tracing::warn!(%error, "polling for revocations failed");
                seen = None;
            }
        }
    }
}

/// How long the listener's connection may take before the attempt counts
/// as failed (and is retried, with backoff).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The `application_name` of a replica's listening connection, so operators
/// (and tests) can tell replicas apart in `pg_stat_activity`.
pub fn application_name(instance: Uuid) -> String {
    format!("keygate-revocations-{}", instance.simple())
}

async fn connect(url: &str, instance: Uuid) -> Result<PgListener, sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?;
    // One attempt first, within seconds: a server that refuses or does not
    // answer is a failure now, with its cause, where the pool would retry
    // until its own timeout and say only that it timed out.
    let probe = tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options))
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)??;
    let _ = probe.close().await;
    let pool = PgPoolOptions::new()
        .acquire_timeout(CONNECT_TIMEOUT)
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_with(options.application_name(&application_name(instance)))
        .await?;
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.listen(REVOCATION_CHANNEL).await?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_not_listening_says_why_and_how_often_it_polls_until_it_listens() {
        let channel = Channel::new();
        assert!(!channel.listening());
        assert_eq!(
            channel.detail().as_deref(),
            Some(
                "revocation channel: not listening (not connected yet); revocations made on \
                 other replicas are polled every 1 s"
            )
        );
        channel.set(None);
        assert!(channel.listening());
        assert_eq!(channel.detail(), None);
        let deaf = Channel::deaf(POOLER_WITHOUT_NOTIFY_URL);
        assert!(!deaf.listening());
        assert!(
            deaf.detail()
                .unwrap()
                .contains("store.notify_url is not set")
        );
        // SQLite polls by design: nothing to say, and never listening.
        assert!(!Channel::local().listening());
        assert_eq!(Channel::local().detail(), None);
    }

    #[test]
    fn revocation_payloads_round_trip() {
        for r in [
            Revocation::Key(Uuid::new_v4()),
            Revocation::User(Uuid::new_v4()),
            Revocation::Session(Uuid::new_v4()),
        ] {
            assert_eq!(Revocation::parse(&r.payload()), Some(r));
        }
        assert_eq!(Revocation::parse("key:not-a-uuid"), None);
        assert_eq!(
            Revocation::parse("tenant:13814000-1dd2-11b2-8080-808080808080"),
            None
        );
    }
}
