//! The one accept loop, for every listener (https, http, admin): TCP, optional
//! TLS, the connection limits (a budget per listener group and a cap per client
//! address), the connection deadlines ([`serve`]), and a graceful drain
//! on shutdown. What a listener serves is its [`Handler`].

pub(crate) mod address_cap;
pub(crate) mod deadlines;
pub(crate) mod descriptors;
pub(crate) mod framing;
pub mod h1fast;
pub mod peer;
pub(crate) mod serve;
pub(crate) mod workers;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use ipnet::IpNet;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_rustls::TlsAcceptor;

use crate::body::Body;
use crate::config::HttpLimits;
use crate::telemetry::Metrics;
use address_cap::{AddressCap, Slot};
use deadlines::{Deadlines, Reason};
use peer::Peer;
use workers::Workers;

/// What a listener serves: every request of its connections.
pub trait Handler: h1fast::FastPath + Send + Sync + 'static {
    fn handle(
        &self,
        req: Request<Incoming>,
        conn: Arc<Peer>,
    ) -> impl Future<Output = Response<Body>> + Send;
}

/// One bound listener and what it serves.
pub struct Listener<H> {
    /// "https", "http" or "admin": the metric label.
    pub name: &'static str,
    pub tcp: TcpListener,
    pub tls: Option<TlsAcceptor>,
    pub handler: Arc<H>,
    /// The budget of open connections this listener draws from; further
    /// connections wait in the accept queue.
    pub connections: Arc<Semaphore>,
    /// Turns true when the listener is to stop accepting and drain.
    pub shutdown: watch::Receiver<bool>,
    /// The threads its connections are served on ([`workers`]); `None`
    /// serves them on the runtime of the accept loop (the admin listener).
    pub workers: Option<Arc<Workers>>,
}

/// What every listener shares.
pub struct Setup {
    builder: auto::Builder<TokioExecutor>,
    per_address: Arc<AddressCap>,
    metrics: Arc<Metrics>,
    deadlines: Deadlines,
    /// Matched once per connection ([`Peer::accept`]).
    trusted_proxies: Vec<IpNet>,
    tls_handshake_timeout: Duration,
    /// How long open connections may take to finish after shutdown.
    grace: Duration,
    /// The most a request head may take before the lean path leaves it to
    /// hyper (hyper's own read buffer limit, which answers 431).
    max_head: usize,
}

impl Setup {
    pub fn new(
        limits: &HttpLimits,
        per_address: Arc<AddressCap>,
        metrics: Arc<Metrics>,
        trusted_proxies: Vec<IpNet>,
        grace: Duration,
    ) -> Setup {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size((limits.max_header_bytes * 2).max(8192));
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_header_list_size((limits.max_header_bytes * 2) as u32)
            .max_concurrent_streams(limits.http2_max_concurrent_streams)
            // A reset frees its stream at once, so the stream limit alone does
            // not bound a "rapid reset" flood: more than this many streams
            // reset by the client before they are served ends the connection
            // (GOAWAY ENHANCE_YOUR_CALM). Also h2's default, kept explicit.
            .max_pending_accept_reset_streams(Some(20))
            .keep_alive_interval(Some(limits.http2_keep_alive_interval))
            .keep_alive_timeout(limits.http2_keep_alive_timeout);
        Setup {
            builder,
            per_address,
            metrics,
            deadlines: Deadlines {
                head: limits.header_read_timeout,
                idle: limits.idle_timeout,
                close: limits.http2_keep_alive_timeout,
            },
            trusted_proxies,
            tls_handshake_timeout: limits.tls_handshake_timeout,
            grace,
            max_head: (limits.max_header_bytes * 2).max(8192),
        }
    }

    /// The same limits with a head deadline of `head` (the admin listener's,
    /// shorter: a silent connection must not hold a probe's place).
    pub(crate) fn with_head_deadline(mut self, head: Duration) -> Setup {
        self.deadlines.head = self.deadlines.head.min(head);
        self
    }
}

/// Serves one listener until its shutdown turns true, then drains open
/// connections for at most the grace period. The listener's connection
/// series exist (at 0) as soon as this is called, before the first poll.
pub fn serve<H: Handler>(
    listener: Listener<H>,
    shared: Arc<Setup>,
) -> impl Future<Output = ()> + Send {
    let reasons = Reason::ALL.map(Reason::label);
    shared.metrics.init_connections(listener.name, &reasons);
    accept_loop(listener, shared)
}

async fn accept_loop<H: Handler>(listener: Listener<H>, shared: Arc<Setup>) {
    let Listener {
        name,
        tcp,
        tls,
        handler,
        connections,
        mut shutdown,
        workers,
    } = listener;
    // Each connection holds a receiver: the signal to drain, and by being
    // dropped, the sign that the connection is gone.
    let (drain, draining) = watch::channel(false);
    loop {
        let permit = tokio::select! {
            _ = shutdown.changed() => break,
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.changed() => break,
            accepted = tcp.accept() => match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::warn!(%error, listener = name, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some((conn, hold)) = admit(&shared, name, tls.is_some(), peer, permit, &draining)
        else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let accepted = Accepted {
            stream,
            tls: tls.clone(),
            handler: handler.clone(),
            conn,
            shared: shared.clone(),
            hold,
        };
        match &workers {
            Some(workers) => hand_over(workers, accepted),
            None => {
                tokio::spawn(accepted.run());
            }
        }
    }
    drop(tcp);
    drop(draining);
    let _ = drain.send(true);
    if tokio::time::timeout(shared.grace, drain.closed())
        .await
        .is_err()
    {
        tracing::warn!(
            listener = name,
            "shutdown grace period ended with connections still open"
        );
    }
}

/// A connection from `peer` under the per-address cap, with its context and
/// what it holds; `None` (and the connection closed) over the cap.
fn admit(
    shared: &Setup,
    name: &'static str,
    tls: bool,
    peer: std::net::SocketAddr,
    permit: OwnedSemaphorePermit,
    draining: &watch::Receiver<bool>,
) -> Option<(Arc<Peer>, Hold)> {
    let Some(slot) = shared.per_address.admit(peer.ip()) else {
        tracing::debug!(%peer, listener = name, "connection over the per-address cap closed");
        shared
            .metrics
            .connection_closed_by(name, Reason::PerAddressCap.label());
        return None;
    };
    let conn = Arc::new(
        Peer::accept(peer, tls, name, &shared.trusted_proxies)
            .sharing_address_load(slot.in_flight()),
    );
    shared.metrics.connection_opened(name);
    let hold = Hold(Arc::new(Held {
        _permit: permit,
        _slot: slot,
        draining: draining.clone(),
        metrics: shared.metrics.clone(),
        listener: name,
    }));
    Some((conn, hold))
}

/// An admitted connection and everything serving it needs.
struct Accepted<H> {
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    handler: Arc<H>,
    conn: Arc<Peer>,
    shared: Arc<Setup>,
    hold: Hold,
}

impl<H: Handler> Accepted<H> {
    async fn run(self) {
        run_connection(
            self.stream,
            self.tls,
            self.handler,
            self.conn,
            self.shared,
            self.hold,
        )
        .await
    }
}

/// Moves an accepted connection to a worker thread: the socket leaves this
/// runtime's reactor for the worker's.
fn hand_over<H: Handler>(workers: &Workers, accepted: Accepted<H>) {
    let name = accepted.conn.listener;
    let Accepted {
        stream,
        tls,
        handler,
        conn,
        shared,
        hold,
    } = accepted;
    let stream = match stream.into_std() {
        Ok(stream) => stream,
        Err(error) => {
            tracing::warn!(%error, listener = name, "handing over a connection failed");
            return;
        }
    };
    workers.run(move || async move {
        match TcpStream::from_std(stream) {
            Ok(stream) => run_connection(stream, tls, handler, conn, shared, hold).await,
            Err(error) => {
                tracing::warn!(%error, listener = name, "taking over a connection failed")
            }
        }
    });
}

/// What an accepted connection holds until it closes: its place in the
/// listener's budget, its place under the per-address cap, the drain signal,
/// and its count among the open connections. A request that may be upgraded
/// carries a clone (a request extension), so that a connection upgraded to a
/// WebSocket keeps its places, stays counted, and is waited for by the
/// drain, until the socket closes.
#[derive(Clone)]
pub struct Hold(Arc<Held>);

struct Held {
    _permit: OwnedSemaphorePermit,
    _slot: Slot,
    draining: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    listener: &'static str,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.metrics.connection_closed(self.listener);
    }
}

impl Hold {
    /// Turns true when the listener drains (shutdown).
    pub fn draining(&self) -> watch::Receiver<bool> {
        self.0.draining.clone()
    }
}

/// Serves one accepted connection and counts how it ended.
async fn run_connection<H: Handler>(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    handler: Arc<H>,
    conn: Arc<Peer>,
    shared: Arc<Setup>,
    hold: Hold,
) {
    let (name, peer) = (conn.listener, conn.peer);
    let reason = handshake_and_serve(stream, tls, handler, conn, &shared, hold).await;
    if let Some(reason) = reason {
        tracing::debug!(%peer, listener = name, reason = reason.label(), "connection closed");
        shared.metrics.connection_closed_by(name, reason.label());
    }
}

/// One accepted connection: the TLS handshake (bounded), then HTTP.
async fn handshake_and_serve<H: Handler>(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    handler: Arc<H>,
    conn: Arc<Peer>,
    shared: &Setup,
    hold: Hold,
) -> Option<Reason> {
    let Some(acceptor) = tls else {
        return serve::connection(
            stream,
            &shared.builder,
            handler,
            conn,
            shared.deadlines,
            shared.max_head,
            hold,
        )
        .await;
    };
    let peer = conn.peer;
    match tokio::time::timeout(shared.tls_handshake_timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls_stream)) => {
            serve::connection(
                tls_stream,
                &shared.builder,
                handler,
                conn,
                shared.deadlines,
                shared.max_head,
                hold,
            )
            .await
        }
        Ok(Err(error)) => {
            tracing::debug!(%error, %peer, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            Some(Reason::TlsHandshakeTimeout)
        }
    }
}
