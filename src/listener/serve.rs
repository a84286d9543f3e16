//! One client connection after accept (and TLS): HTTP/1.1 or HTTP/2 served by
//! hyper, and the deadlines that keep a silent, idle or dead peer from holding
//! the connection, with the in-flight tracking they need.
//!
//! - head: from accept (or the end of the TLS handshake) to the first complete
//!   request head, covering the first bytes and the HTTP/1.1 / HTTP/2
//!   detection, for which hyper has no timeout of its own. Later heads of an
//!   HTTP/1.1 connection are hyper's `header_read_timeout`, which starts again
//!   as soon as a response is written, so it also closes idle HTTP/1.1
//!   connections.
//! - idle: no request in flight (head received, response not yet fully sent)
//!   for the idle time: closed gracefully (HTTP/2: GOAWAY).
//! - close: a connection asked to close gracefully (idle, or a response that
//!   says `Connection: close`) is dropped if it has not closed within this.
//! - HTTP/2 keep-alive pings are hyper's (`keep_alive_interval`, `_timeout`).

use std::convert::Infallible;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, Version, header};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Handler;
use super::deadlines::{Deadlines, Reason};
use super::framing::AmbiguousFraming;
use super::h1fast;
use super::peer::Peer;
use crate::body::{Body, BoxError};
use crate::http1::FramingScanner;

/// What the driver learns from the requests of its connection.
#[derive(Debug)]
struct State {
    /// Requests whose head arrived and whose response is not fully sent.
    in_flight: usize,
    /// Requests seen so far.
    requests: u64,
    /// When `in_flight` last fell to zero.
    idle_since: Instant,
    /// `Activity::bytes_read` at that moment.
    read_at_idle: u64,
    /// The requests came over HTTP/2.
    http2: bool,
    /// A response asked to close the connection (and why, when it counts).
    close: Option<Option<Reason>>,
}

/// Shared by the connection's driver and its requests.
struct Activity {
    state: Mutex<State>,
    /// Woken by the first request, and when a response asks to close the
    /// connection.
    wake: Notify,
    /// Bytes received so far: tells an idle connection from a slow next head.
    bytes_read: AtomicU64,
    /// A request head on this connection named both `Content-Length` and
    /// `Transfer-Encoding` ([`super::framing`]).
    ambiguous_framing: std::sync::atomic::AtomicBool,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            state: Mutex::new(State {
                in_flight: 0,
                requests: 0,
                idle_since: Instant::now(),
                read_at_idle: 0,
                http2: false,
                close: None,
            }),
            wake: Notify::new(),
            bytes_read: AtomicU64::new(0),
            ambiguous_framing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn start(self: &Arc<Self>, version: Version) -> InFlight {
        let mut state = self.lock();
        state.in_flight += 1;
        state.requests += 1;
        state.http2 = version == Version::HTTP_2;
        if state.requests == 1 {
            // The driver waits for the head deadline until now.
            drop(state);
            self.wake.notify_one();
        }
        InFlight(self.clone())
    }

    fn request_close(&self, reason: Option<Reason>) {
        self.lock().close.get_or_insert(reason);
        self.wake.notify_one();
    }

    /// When the driver must next look: the head deadline until a request
    /// arrived, then the end of the current idle period.
    fn next_check(&self, opened: Instant, deadlines: Deadlines) -> Instant {
        let state = self.lock();
        if state.requests == 0 {
            opened + deadlines.head
        } else if state.in_flight == 0 {
            state.idle_since + deadlines.idle
        } else {
            // Busy: the idle period starts later than this.
            Instant::now() + deadlines.idle
        }
    }

    /// Which deadline, if any, has passed at `now`.
    fn due(&self, now: Instant, opened: Instant, deadlines: Deadlines) -> Option<Reason> {
        let state = self.lock();
        if state.requests == 0 {
            (now >= opened + deadlines.head).then_some(Reason::HeadTimeout)
        } else {
            (state.in_flight == 0 && now >= state.idle_since + deadlines.idle)
                .then_some(Reason::Idle)
        }
    }

    /// Why hyper ended the connection, when it was one of our limits.
    fn classify(&self, result: &Result<(), BoxError>) -> Option<Reason> {
        let state = self.lock();
        if let Some(reason) = state.close {
            // A response closed it (HTTP/1.1 closes on its own, maybe before
            // the driver heard of it).
            return reason;
        }
        match result {
            Err(error)
                if error
                    .downcast_ref::<hyper::Error>()
                    .is_some_and(hyper::Error::is_timeout) =>
            {
                Some(if state.requests == 0 {
                    Reason::HeadTimeout
                } else if state.http2 {
                    Reason::KeepAliveTimeout
                } else if state.in_flight == 0
                    && state.read_at_idle == self.bytes_read.load(Ordering::Relaxed)
                {
                    // hyper's `header_read_timeout` restarts when a response
                    // is sent: with not one byte since, the connection was idle.
                    Reason::Idle
                } else {
                    Reason::HeadTimeout
                })
            }
            _ => None,
        }
    }
}

/// One request in flight, until its response body is finished or dropped.
struct InFlight(Arc<Activity>);

/// The driver is not woken when a request ends: its next check is never
/// later than the idle deadline (while busy it looks again one idle time
/// later, and then sleeps on to the end of the idle period). The first
/// request does wake it, to end the wait for the head deadline. Waking it at
/// the end of every request cost a poll of the whole connection and a timer
/// registered and cancelled per request (BENCHMARKS.md, "Choices in the code").
impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        if state.in_flight == 0 {
            state.idle_since = Instant::now();
            state.read_at_idle = self.0.bytes_read.load(Ordering::Relaxed);
        }
    }
}

/// A response body that keeps its request counted as in flight.
pub struct Tracked {
    inner: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The connection's transport, counting the bytes it receives and watching
/// HTTP/1 request heads for ambiguous framing.
struct Counted<I> {
    io: I,
    activity: Arc<Activity>,
    /// `None` once the connection turned out to speak HTTP/2, whose framing
    /// has no such ambiguity.
    framing: Option<FramingScanner>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Counted<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if read > 0 {
            let first = self
                .activity
                .bytes_read
                .fetch_add(read as u64, Ordering::Relaxed)
                == 0;
            let this = &mut *self;
            let bytes = &buf.filled()[before..];
            if first && bytes.starts_with(b"PRI ") {
                this.framing = None;
            }
            if let Some(scanner) = this.framing.as_mut() {
                scanner.feed(bytes);
                if scanner.ambiguous() {
                    this.activity
                        .ambiguous_framing
                        .store(true, Ordering::Relaxed);
                    this.framing = None;
                }
            }
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Counted<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Serves one connection until it closes or a deadline closes it; returns why
/// keygate closed it, when it did.
pub async fn connection<I, H>(
    io: I,
    builder: &auto::Builder<TokioExecutor>,
    handler: Arc<H>,
    conn: Arc<Peer>,
    deadlines: Deadlines,
    max_head: usize,
    hold: super::Hold,
) -> Option<Reason>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    let mut drain = hold.draining();
    // The lean path reads the connection first; hyper takes it over (with
    // the bytes read so far) at the first request the lean path declines.
    let io = if handler.fast_path() {
        let opened = Instant::now();
        match h1fast::serve(io, &handler, &conn, opened, deadlines, max_head, &mut drain).await {
            h1fast::Outcome::Closed(reason) => return reason,
            h1fast::Outcome::Hyper(replay) => replay,
        }
    } else {
        h1fast::Replay::new(bytes::BytesMut::new(), io)
    };
    // Boxed: hyper's connection is the largest part of this future, which
    // every connection carried from its accept, lean ones included, idle or
    // not (with the lean path's request future, 9 KB of each idle TLS
    // connection's 24 KB: resident memory over 5,000 idle connections).
    Box::pin(with_hyper(
        io, builder, handler, conn, deadlines, hold, drain,
    ))
    .await
}

/// Serves a connection with hyper from here ([`connection`]).
async fn with_hyper<I, H>(
    io: h1fast::Replay<I>,
    builder: &auto::Builder<TokioExecutor>,
    handler: Arc<H>,
    conn: Arc<Peer>,
    deadlines: Deadlines,
    hold: super::Hold,
    drain: tokio::sync::watch::Receiver<bool>,
) -> Option<Reason>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    let opened = Instant::now();
    let activity = Arc::new(Activity::new());
    let requests = activity.clone();
    let service = service_fn(move |mut req: Request<Incoming>| {
        // Only a request that may be upgraded keeps the connection's places.
        if req.headers().contains_key(header::UPGRADE) {
            req.extensions_mut().insert(hold.clone());
        }
        let in_flight = requests.start(req.version());
        if requests.ambiguous_framing.load(Ordering::Relaxed)
            && req.headers().contains_key(header::TRANSFER_ENCODING)
        {
            req.extensions_mut().insert(AmbiguousFraming);
        }
        respond(handler.clone(), req, conn.clone(), in_flight)
    });
    let io = Counted {
        io,
        activity: activity.clone(),
        framing: Some(FramingScanner::default()),
    };
    let conn = pin!(builder.serve_connection_with_upgrades(TokioIo::new(io), service));
    watch(conn, &activity, opened, deadlines, drain).await
}

/// Drives a served connection to its end, closing it when a deadline passes,
/// a response asks to, or the listener drains; returns why keygate closed
/// it, when it did.
async fn watch<C>(
    mut conn: Pin<&mut C>,
    activity: &Activity,
    opened: Instant,
    deadlines: Deadlines,
    mut drain: tokio::sync::watch::Receiver<bool>,
) -> Option<Reason>
where
    C: GracefulConnection<Error = BoxError>,
{
    // Once a graceful close has started: its hard deadline and why it started.
    let mut closing: Option<(Instant, Option<Reason>)> = None;
    let mut shut_down = false;
    let mut shut = |conn: Pin<&mut C>| {
        if !std::mem::replace(&mut shut_down, true) {
            conn.graceful_shutdown();
        }
    };
    let mut draining = false;
    loop {
        let next = match closing {
            Some((at, _)) => at,
            None => activity.next_check(opened, deadlines),
        };
        tokio::select! {
            result = conn.as_mut() => {
                return match closing {
                    Some((_, reason)) => reason,
                    None => activity.classify(&result),
                };
            }
            () = tokio::time::sleep_until(next) => {
                if let Some((_, reason)) = closing {
                    // The graceful close did not finish in time: drop it.
                    return reason;
                }
                match activity.due(Instant::now(), opened, deadlines) {
                    Some(Reason::HeadTimeout) => return Some(Reason::HeadTimeout),
                    Some(reason) => {
                        shut(conn.as_mut());
                        closing = Some((Instant::now() + deadlines.close, Some(reason)));
                    }
                    None => {}
                }
            }
            () = activity.wake.notified(), if closing.is_none() => {
                let close = activity.lock().close;
                if let Some(reason) = close {
                    shut(conn.as_mut());
                    closing = Some((Instant::now() + deadlines.close, reason));
                }
            }
            _ = drain.changed(), if !draining => {
                // The listener bounds the drain by the shutdown grace period.
                draining = true;
                shut(conn.as_mut());
            }
        }
    }
}

/// One request through the handler. A response that asks to close the
/// connection starts a graceful close; its body counts as in flight until sent.
async fn respond<H: Handler>(
    handler: Arc<H>,
    req: Request<Incoming>,
    conn: Arc<Peer>,
    in_flight: InFlight,
) -> Result<Response<Tracked>, Infallible> {
    let version = req.version();
    // Boxed: hyper spawns each HTTP/2 stream's future as a task, and with the
    // handler's kilobytes inline, moving it there was 4% of keygate's CPU
    // time under `benches/run`'s HTTP/2 case (`memmove` in `tokio::spawn`,
    // `perf`).
    let mut response = Box::pin(handler.handle(req, conn)).await;
    if asks_to_close(&response) {
        let reason =
            (response.status() == StatusCode::REQUEST_TIMEOUT).then_some(Reason::BodyTimeout);
        in_flight.0.request_close(reason);
        if version == Version::HTTP_2 {
            // Connection-specific headers are not allowed in HTTP/2;
            // the driver sends GOAWAY instead.
            response.headers_mut().remove(header::CONNECTION);
        }
    }
    Ok(response.map(|inner| Tracked {
        inner,
        _in_flight: in_flight,
    }))
}

fn asks_to_close<B>(response: &Response<B>) -> bool {
    response
        .headers()
        .get(header::CONNECTION)
        .is_some_and(|v| v == HeaderValue::from_static("close"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const DEADLINES: Deadlines = Deadlines {
        head: Duration::from_secs(10),
        idle: Duration::from_secs(60),
        close: Duration::from_secs(20),
    };

    #[tokio::test]
    async fn head_deadline_runs_until_the_first_request_then_idle_takes_over() {
        let activity = Arc::new(Activity::new());
        let opened = Instant::now();
        assert_eq!(
            activity.next_check(opened, DEADLINES),
            opened + DEADLINES.head
        );
        assert_eq!(
            activity.due(opened + DEADLINES.head, opened, DEADLINES),
            Some(Reason::HeadTimeout)
        );
        let request = activity.start(Version::HTTP_11);
        assert_eq!(
            activity.due(opened + DEADLINES.idle * 2, opened, DEADLINES),
            None
        );
        drop(request);
        let idle_since = activity.lock().idle_since;
        assert_eq!(
            activity.next_check(opened, DEADLINES),
            idle_since + DEADLINES.idle
        );
        assert_eq!(
            activity.due(idle_since + DEADLINES.idle, opened, DEADLINES),
            Some(Reason::Idle)
        );
    }

    #[tokio::test]
    async fn a_request_in_flight_is_not_idle_until_its_response_ends() {
        let activity = Arc::new(Activity::new());
        let opened = Instant::now();
        let first = activity.start(Version::HTTP_2);
        let second = activity.start(Version::HTTP_2);
        drop(first);
        let later = Instant::now() + DEADLINES.idle * 2;
        assert_eq!(activity.due(later, opened, DEADLINES), None);
        drop(second);
        assert_eq!(activity.due(later, opened, DEADLINES), Some(Reason::Idle));
    }
}
