//! Revocation across replicas: every replica on a PostgreSQL store listens on
//! the revocation channel and drops the cache entries a change affects.
//!
//! If the listening connection is lost, notifications sent meanwhile are lost
//! too: on every (re)connect the credential caches are flushed, and the cache
//! TTL (`cache.ttl`) bounds staleness while the connection is down.
//!
//! On SQLite there is no notification between processes: the server polls the
//! store's audit events ([`poll`]) every [`POLL_INTERVAL`], so a change the
//! command line makes reaches it within about a second, not at cache expiry.

use std::sync::Arc;
use std::time::Duration;

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
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

/// Listens until shutdown, reconnecting with backoff.
/// `keygate_revocation_listener_up` is exported (at 0) as soon as this is
/// called: it exists only where a listener does.
pub fn listen(
    url: String,
    instance: Uuid,
    auth: Arc<Authenticator>,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send {
    metrics.init_revocation_listener();
    listen_until_shutdown(url, instance, auth, metrics, shutdown)
}

async fn listen_until_shutdown(
    url: String,
    instance: Uuid,
    auth: Arc<Authenticator>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        match connect(&url, instance).await {
            Ok(mut listener) => {
                // Whatever was sent while no one listened is unknown: forget all.
                auth.caches().invalidate_all();
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
                                tracing::warn!("revocation listener lost its connection");
                                break;
                            }
                            Err(error) => {
                                tracing::warn!(%error, "revocation listener failed");
                                break;
                            }
                        }
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "revocation listener cannot connect"),
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

/// Polls the store's audit events until shutdown (SQLite): each change to a
/// user or key written since the last poll, by this process or another, is
/// applied like a received notification. When a poll fails, nothing is known
/// of what happened meanwhile: once the store answers again the credential
/// caches are flushed, as the PostgreSQL listener does on reconnecting.
pub async fn poll(
    store: Store,
    auth: Arc<Authenticator>,
    interval: Duration,
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

/// The `application_name` of a replica's listening connection, so operators
/// (and tests) can tell replicas apart in `pg_stat_activity`.
pub fn application_name(instance: Uuid) -> String {
    format!("keygate-revocations-{}", instance.simple())
}

async fn connect(url: &str, instance: Uuid) -> Result<PgListener, sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?.application_name(&application_name(instance));
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_with(options)
        .await?;
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.listen(REVOCATION_CHANNEL).await?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

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
