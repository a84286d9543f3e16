//! Frames both ways between the client's socket and the upstream's, ping
//! and pong included, until one side closes or keygate ends the socket: the
//! credential died, the client went idle, the server drains.
//!
//! The credential is verified again when a revocation wakes the socket, at
//! its own expiry, and unprompted at least once per `cache.ttl` (a random
//! time between half and all of it, so sockets opened together spread
//! their checks): a change another process made to the store, with no
//! revocation channel to announce it (SQLite, the CLI), reaches the caches
//! within `cache.ttl`, and so closes the socket within twice that.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::ending::{ClientSocket, Ending, UpstreamSocket};
use crate::auth::credential::Credential;
use crate::auth::live::Held;
use crate::auth::{AuthFailure, Authenticator};
use crate::config::WebSocketSettings;

/// Payload bytes from and to the client, for the access log.
#[derive(Debug, Default)]
pub struct Traffic {
    pub from_client: u64,
    pub to_client: u64,
}

/// What re-checks the credential: a revocation wakes `held`; the
/// credential's own expiry is a timer, and so is the unprompted check.
pub struct Recheck<'a> {
    pub held: &'a Held,
    pub credential: Credential,
    pub auth: &'a Arc<Authenticator>,
    /// The longest the socket goes without verifying again: `cache.ttl`.
    pub every: Duration,
}

/// The unprompted checks follow `cache.ttl`, but never a shorter one than
/// this: they would cost more than they tell.
const SHORTEST_ROUND: Duration = Duration::from_millis(100);

impl Recheck<'_> {
    /// Verifies again through the caches (a revocation dropped what it
    /// changed); the failure that ends the socket, if any.
    async fn still_valid(&self) -> Result<(), Ending> {
        match self.auth.verify(&self.credential).await {
            Ok(_) => Ok(()),
            Err(failure) => Err(Ending::Revoked(failure)),
        }
    }

    /// When to verify again unprompted: a random time between half and all
    /// of [`Recheck::every`] from now.
    fn next_round(&self) -> Instant {
        Instant::now() + round_delay(self.every, uuid::Uuid::new_v4().as_u128() as u64)
    }

    /// The unprompted check: like [`Recheck::still_valid`], except that a
    /// store that cannot answer keeps the socket open (the next round asks
    /// again), so a store outage does not close every socket at once.
    async fn round(&self) -> Result<(), Ending> {
        match self.still_valid().await {
            Err(Ending::Revoked(AuthFailure::StoreUnavailable)) => {
                tracing::warn!(
                    "an open socket's credential could not be verified again: the store did not answer"
                );
                Ok(())
            }
            checked => checked,
        }
    }

    /// When the credential stops being valid on its own, if ever.
    async fn expiry(&self) -> Option<Instant> {
        let at_ms = self.auth.expiry(&self.credential).await?;
        let left = at_ms.saturating_sub(crate::clock::now_ms()).max(0) as u64;
        // A moment past the deadline, so the check that follows sees it passed.
        Some(Instant::now() + Duration::from_millis(left + 5))
    }

    /// The timers of a socket that just opened.
    async fn timers(&self) -> Timers {
        Timers {
            expiry: self.expiry().await.unwrap_or_else(never),
            round: self.next_round(),
        }
    }

    /// Runs the check whose timer is due, and sets that timer again.
    async fn on_timer(&self, timers: &mut Timers) -> Result<(), Ending> {
        if Instant::now() >= timers.expiry {
            self.still_valid().await?;
            timers.expiry = self.expiry().await.unwrap_or_else(never);
        } else {
            self.round().await?;
            timers.round = self.next_round();
        }
        Ok(())
    }
}

/// When a socket's credential is next checked unprompted: at its own expiry,
/// and at the next round.
struct Timers {
    expiry: Instant,
    round: Instant,
}

impl Timers {
    fn never() -> Timers {
        Timers {
            expiry: never(),
            round: never(),
        }
    }

    fn next(&self) -> Instant {
        self.expiry.min(self.round)
    }
}

/// Half of `every` (at least [`SHORTEST_ROUND`]) and, by `random`, up to
/// as much again.
fn round_delay(every: Duration, random: u64) -> Duration {
    let half = every.max(SHORTEST_ROUND) / 2;
    let spread = half.as_millis() as u64;
    half + Duration::from_millis(random % (spread + 1))
}

/// A deadline that never comes while a socket is open.
fn never() -> Instant {
    Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

/// Splices until the socket ends, and says how.
pub async fn run(
    client: &mut ClientSocket,
    upstream: &mut UpstreamSocket,
    recheck: Option<Recheck<'_>>,
    mut drain: watch::Receiver<bool>,
    settings: &WebSocketSettings,
    traffic: &mut Traffic,
) -> Ending {
    let mut timers = match &recheck {
        Some(recheck) => recheck.timers().await,
        None => Timers::never(),
    };
    let mut last_heard = Instant::now();
    let mut pinged = false;
    // Both timers are made once and moved only when they fire: a timer made
    // anew for every message registered and cleared two of them per message.
    // A message heard only moves `last_heard`; the quiet timer, when it
    // fires, first looks whether it came early.
    let mut quiet = std::pin::pin!(tokio::time::sleep_until(
        last_heard + settings.ping_interval
    ));
    let mut checks = std::pin::pin!(tokio::time::sleep_until(timers.next()));
    loop {
        tokio::select! {
            message = client.next() => {
                last_heard = Instant::now();
                pinged = false;
                let passed = async {
                    let message = from_client(message, traffic)?;
                    pass(message, client, upstream, from_client, traffic, || Ending::UpstreamUnavailable).await
                };
                if let Err(ending) = passed.await {
                    return ending;
                }
            }
            message = upstream.next() => {
                let passed = async {
                    let message = from_upstream(message, traffic)?;
                    pass(message, upstream, client, from_upstream, traffic, || Ending::ClientGone).await
                };
                if let Err(ending) = passed.await {
                    return ending;
                }
            }
            () = woken(&recheck) => {
                if let Some(recheck) = &recheck
                    && let Err(ending) = recheck.still_valid().await {
                        return ending;
                    }
            }
            () = checks.as_mut() => {
                match &recheck {
                    Some(recheck) => {
                        if let Err(ending) = recheck.on_timer(&mut timers).await {
                            return ending;
                        }
                    }
                    None => timers = Timers::never(),
                }
                checks.as_mut().reset(timers.next());
            }
            () = quiet.as_mut() => {
                let quiet_until = last_heard
                    + if pinged {
                        settings.idle_timeout
                    } else {
                        settings.ping_interval
                    };
                if quiet_until > Instant::now() {
                    quiet.as_mut().reset(quiet_until);
                    continue;
                }
                if pinged {
                    return Ending::Idle;
                }
                pinged = true;
                quiet.as_mut().reset(last_heard + settings.idle_timeout);
                if client.send(Message::Ping(Default::default())).await.is_err() {
                    return Ending::ClientGone;
                }
            }
            () = drained(&mut drain) => return Ending::Shutdown,
        }
    }
}

/// What one side sent, as read from its socket.
type Read = Option<Result<Message, WsError>>;

/// A message the client sent, counted, to go upstream; or how the socket
/// ends with it.
fn from_client(read: Read, traffic: &mut Traffic) -> Result<Message, Ending> {
    let message = match read {
        Some(Ok(Message::Close(frame))) => return Err(Ending::ClientClosed(frame)),
        Some(Ok(message)) => message,
        Some(Err(WsError::Capacity(_))) => return Err(Ending::MessageTooBig),
        Some(Err(_)) | None => return Err(Ending::ClientGone),
    };
    traffic.from_client += message.len() as u64;
    Ok(message)
}

/// A message the upstream sent, counted, to go to the client; or how the
/// socket ends with it.
fn from_upstream(read: Read, traffic: &mut Traffic) -> Result<Message, Ending> {
    let message = match read {
        Some(Ok(Message::Close(frame))) => return Err(Ending::UpstreamClosed(frame)),
        Some(Ok(message)) => message,
        Some(Err(_)) | None => return Err(Ending::UpstreamClosed(None)),
    };
    traffic.to_client += message.len() as u64;
    Ok(message)
}

/// The most messages passed on in one write.
const BATCH: usize = 16;

/// Passes `first` on to `to`, with the messages `from` has already read
/// behind it (up to [`BATCH`]), then flushes once: messages that arrived
/// together leave in one write, as a byte-relaying proxy's would, where a
/// flush per message wrote each one apart. `take` is [`from_client`] or
/// [`from_upstream`]; `failed` the ending when `to` can take no more.
async fn pass<R, W>(
    first: Message,
    from: &mut R,
    to: &mut W,
    take: fn(Read, &mut Traffic) -> Result<Message, Ending>,
    traffic: &mut Traffic,
    failed: impl Fn() -> Ending,
) -> Result<(), Ending>
where
    R: futures_util::Stream<Item = Result<Message, WsError>> + Unpin,
    W: futures_util::Sink<Message> + Unpin,
{
    use futures_util::FutureExt as _;
    to.feed(first).await.map_err(|_| failed())?;
    let mut ended = None;
    for _ in 1..BATCH {
        let Some(read) = from.next().now_or_never() else {
            break;
        };
        match take(read, traffic) {
            Ok(message) => to.feed(message).await.map_err(|_| failed())?,
            Err(ending) => {
                ended = Some(ending);
                break;
            }
        }
    }
    // What was fed goes out before an ending found behind it.
    to.flush().await.map_err(|_| failed())?;
    ended.map_or(Ok(()), Err)
}

/// Completes when the listener drains; never once no drain can come.
pub async fn drained(drain: &mut watch::Receiver<bool>) {
    if drain.wait_for(|draining| *draining).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Completes when a revocation woke the holder; never without one.
async fn woken(recheck: &Option<Recheck<'_>>) {
    match recheck {
        Some(recheck) => recheck.held.woken().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unprompted_checks_come_between_half_and_all_of_the_cache_ttl() {
        let ttl = Duration::from_secs(30);
        for random in [0, 1, 14_999, 15_000, 15_001, u64::MAX] {
            let delay = round_delay(ttl, random);
            assert!(delay >= ttl / 2 && delay <= ttl, "{delay:?}");
        }
        assert_eq!(round_delay(ttl, 0), ttl / 2);
        assert_eq!(round_delay(ttl, 15_000), ttl);
        // A tiny TTL cannot turn the check into a busy loop.
        assert!(round_delay(Duration::from_millis(1), 0) >= SHORTEST_ROUND / 2);
    }
}
