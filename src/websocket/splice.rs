//! Frames both ways between the client's socket and the upstream's, ping
//! and pong included, until one side closes or keygate ends the socket: the
//! credential died, the client went idle, the server drains.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::ending::{ClientSocket, Ending, UpstreamSocket};
use crate::auth::Authenticator;
use crate::auth::credential::Credential;
use crate::auth::live::Held;
use crate::config::WebSocketSettings;

/// Payload bytes from and to the client, for the access log.
#[derive(Debug, Default)]
pub struct Traffic {
    pub from_client: u64,
    pub to_client: u64,
}

/// What re-checks the credential: a revocation wakes `held`; the
/// credential's own expiry is a timer.
pub struct Recheck<'a> {
    pub held: &'a Held,
    pub credential: Credential,
    pub auth: &'a Arc<Authenticator>,
}

impl Recheck<'_> {
    /// Verifies again through the caches (a revocation dropped what it
    /// changed); the failure that ends the socket, if any.
    async fn still_valid(&self) -> Result<(), Ending> {
        match self.auth.verify(&self.credential).await {
            Ok(_) => Ok(()),
            Err(failure) => Err(Ending::Revoked(failure)),
        }
    }

    /// When the credential stops being valid on its own, if ever.
    async fn expiry(&self) -> Option<Instant> {
        let at_ms = self.auth.expiry(&self.credential).await?;
        let left = at_ms.saturating_sub(crate::clock::now_ms()).max(0) as u64;
        // A moment past the deadline, so the check that follows sees it passed.
        Some(Instant::now() + Duration::from_millis(left + 5))
    }
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
    let far = Instant::now() + Duration::from_secs(365 * 24 * 3600);
    let mut expiry = match &recheck {
        Some(recheck) => recheck.expiry().await.unwrap_or(far),
        None => far,
    };
    let mut last_heard = Instant::now();
    let mut pinged = false;
    loop {
        let quiet_until = last_heard
            + if pinged {
                settings.idle_timeout
            } else {
                settings.ping_interval
            };
        tokio::select! {
            message = client.next() => {
                let message = match message {
                    Some(Ok(message)) => message,
                    Some(Err(WsError::Capacity(_))) => return Ending::MessageTooBig,
                    Some(Err(_)) | None => return Ending::ClientGone,
                };
                last_heard = Instant::now();
                pinged = false;
                if let Message::Close(frame) = message {
                    return Ending::ClientClosed(frame);
                }
                traffic.from_client += message.len() as u64;
                if upstream.send(message).await.is_err() {
                    return Ending::UpstreamUnavailable;
                }
            }
            message = upstream.next() => {
                let message = match message {
                    Some(Ok(Message::Close(frame))) => return Ending::UpstreamClosed(frame),
                    Some(Ok(message)) => message,
                    Some(Err(_)) | None => return Ending::UpstreamClosed(None),
                };
                traffic.to_client += message.len() as u64;
                if client.send(message).await.is_err() {
                    return Ending::ClientGone;
                }
            }
            () = woken(&recheck) => {
                if let Some(recheck) = &recheck {
                    if let Err(ending) = recheck.still_valid().await {
                        return ending;
                    }
                }
            }
            () = tokio::time::sleep_until(expiry) => {
                if let Some(recheck) = &recheck {
                    if let Err(ending) = recheck.still_valid().await {
                        return ending;
                    }
                    expiry = recheck.expiry().await.unwrap_or(far);
                } else {
                    expiry = far;
                }
            }
            () = tokio::time::sleep_until(quiet_until) => {
                if pinged {
                    return Ending::Idle;
                }
                pinged = true;
                if client.send(Message::Ping(Default::default())).await.is_err() {
                    return Ending::ClientGone;
                }
            }
            () = drained(&mut drain) => return Ending::Shutdown,
        }
    }
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
