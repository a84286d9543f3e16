//! The upstream client: HTTP/1.1 keep-alive connections driven by the task of
//! the request that uses them, pooled per worker thread.
//!
//! hyper's legacy client (`hyper_util::client::legacy`) runs each connection in
//! a task of its own: every request is checked out of a shared pool, handed to
//! that task over a channel, and its response handed back, a wake of another
//! task (often on the other worker thread) each way, which showed in the
//! profile and in the latency added on one connection (BENCHMARKS.md, "Choices in the code"). Here the request's
//! own task polls the connection (`hyper::client::conn::http1`): while waiting
//! for the response head in [`UpstreamClient::send`], then from the response
//! body ([`Pooled`]) until the body ends, when the connection goes back to the
//! pool of the thread that ends it.
//!
//! Each worker thread (`listener::workers`) has a pool of its own and takes
//! connections from it alone: a connection's socket is registered with the
//! reactor of the thread that opened it, and used from another thread every
//! readiness event would cost a wake across threads (an `eventfd` write)
//! (BENCHMARKS.md, "Choices in the code").
//! Threads that are not workers (tests, tools) share the pools by turns.
//!
//! An idle connection is polled by no one: a connection the upstream closed
//! is found so when it is checked out (its end of stream was recorded by the
//! reactor) and dropped; a request whose pooled connection broke before the
//! request was written goes again on a new connection, once. Connections idle
//! for longer than `proxy.pool_idle_timeout` are closed by a sweep.
//!
//! A request whose body was read whole (the lean path's) goes on a
//! connection of another kind, spoken to with [`wire`] instead of hyper:
//! the same per-thread pools, a list of their own in each, under the same
//! ceilings; at the ceiling, an idle connection of the other kind is closed
//! to make room. Such a connection goes back to the pool when its answer was
//! read to its end with nothing after it, and is found closed at checkout
//! as hyper's are, by the reactor's readiness.
//!
//! A connection to an `https://` upstream is TLS over TCP
//! ([`super::stream::Stream`]), opened with its route's TLS settings and
//! pooled by them as well as by authority ([`Endpoint`]): the same pools,
//! reuse and checks as a plain one.
//!
//! Connections open to one upstream (idle or busy) are bounded by
//! `proxy.max_connections_per_upstream`: each holds a permit of its
//! upstream's [`Gate`] until it closes. A request that finds none idle and
//! the upstream at its ceiling waits in a short queue (at most
//! `proxy.upstream_queue` requests, each for at most
//! `proxy.upstream_queue_timeout`) for a connection to come back or close;
//! past that it fails with [`SendError::Saturated`] rather than pile up
//! sockets.

use std::collections::HashMap;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf as _, Bytes, BytesMut};
use http::uri::Authority;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::body::{self, Body};
use crate::http1::{Chunked, Framing, ResponseHead};
use crate::proxy::headers::Added;
use crate::proxy::stream::{Endpoint, EndpointKey, OpenError, Stream};
use crate::proxy::wire::{self, WireError};

type Driver = http1::Connection<TokioIo<Stream>, Body>;

/// One upstream connection: the handle requests are sent through and the
/// connection itself, polled by whoever holds it.
struct Conn {
    sender: http1::SendRequest<Body>,
    /// `None` once the connection has ended.
    driver: Option<Driver>,
    /// Its places under the upstream's ceiling and the total one, given
    /// back when it closes.
    open: Places,
}

impl Conn {
    /// Moves the connection on (writes, reads, state changes); `true` while
    /// it is still open.
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(driver) = self.driver.as_mut() else {
            return false;
        };
        match Pin::new(driver).poll(cx) {
            Poll::Pending => true,
            Poll::Ready(_) => {
                self.driver = None;
                false
            }
        }
    }

    /// Ready for a new request: `Ready(true)`, or `Ready(false)` once the
    /// connection has ended.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        if !self.drive(cx) {
            return Poll::Ready(false);
        }
        self.sender.poll_ready(cx).map(|ready| ready.is_ok())
    }

    /// Ready for a new request now, without waiting.
    fn ready_now(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        matches!(self.poll_idle(&mut cx), Poll::Ready(true))
    }
}

/// One upstream connection spoken to with [`wire`]: for requests whose
/// body is read whole (the lean path's).
struct WireConn {
    stream: Stream,
    /// Bytes read and not yet used: the response head and body as they
    /// arrive.
    buf: BytesMut,
    /// The request head (and a small body) written in one go.
    out: Vec<u8>,
    open: Places,
}

/// What the pools need of a kind of connection.
trait Link: Sized {
    /// The pool of this kind in a shard.
    fn idle(shard: &mut Shard) -> &mut ByUpstream<Vec<Idle<Self>>>;
    /// Ready for a new request now, without waiting.
    fn ready_now(&mut self) -> bool;
    /// Its exchange over, may it go back to the pool.
    fn settled(&mut self) -> bool;
    fn places(&self) -> &Places;
    /// A new connection on `stream`.
    fn open(
        stream: Stream,
        open: Places,
    ) -> impl std::future::Future<Output = Result<Self, SendError>> + Send;
}

impl Link for Conn {
    fn idle(shard: &mut Shard) -> &mut ByUpstream<Vec<Idle<Self>>> {
        &mut shard.idle
    }

    fn ready_now(&mut self) -> bool {
        Conn::ready_now(self)
    }

    fn settled(&mut self) -> bool {
        // Lets it take in the end of the response and become ready; polled
        // with a waker that wakes nothing, as no task waits on it now.
        let mut cx = Context::from_waker(Waker::noop());
        self.drive(&mut cx) && !self.sender.is_closed()
    }

    fn places(&self) -> &Places {
        &self.open
    }

    async fn open(stream: Stream, open: Places) -> Result<Conn, SendError> {
        let (sender, driver) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(SendError::Request)?;
        Ok(Conn {
            sender,
            driver: Some(driver),
            open,
        })
    }
}

impl Link for WireConn {
    fn idle(shard: &mut Shard) -> &mut ByUpstream<Vec<Idle<Self>>> {
        &mut shard.wire
    }

    fn ready_now(&mut self) -> bool {
        // Nothing may be waiting on an idle connection: an end of stream
        // (the upstream closed it, over TLS with a `close_notify` or not)
        // or stray bytes both rule it out. Asked of the reactor's
        // readiness, as hyper's client does: what arrived was recorded as
        // readiness when the reactor last looked, and an empty socket costs
        // no system call.
        self.buf.is_empty() && self.stream.idle_and_open()
    }

    fn settled(&mut self) -> bool {
        // The socket is not asked here: an upstream that closes right after
        // its answer is found by the reactor before the next checkout, and
        // within the race of a keep-alive running out the idempotent
        // request goes again (`send_whole`). A `recvfrom` here cost every
        // request one more system call (`strace -c` under `benches/run`:
        // three per request, against two for hyper's client).
        if !self.ready_now() {
            return false;
        }
        if self.buf.capacity() > MAX_IDLE_BUFFER {
            // A large answer grew it: an idle connection keeps a small one.
            self.buf = BytesMut::with_capacity(WIRE_BUFFER);
        }
        true
    }

    fn places(&self) -> &Places {
        &self.open
    }

    async fn open(stream: Stream, open: Places) -> Result<WireConn, SendError> {
        Ok(WireConn {
            stream,
            buf: BytesMut::with_capacity(WIRE_BUFFER),
            out: Vec::with_capacity(1024),
            open,
        })
    }
}

/// A wire connection's read buffer, and the most an idle one keeps.
const WIRE_BUFFER: usize = 8 * 1024;
const MAX_IDLE_BUFFER: usize = 64 * 1024;
/// The most one read of a response body with a length asks for.
const BODY_READ: usize = 64 * 1024;

struct Idle<T> {
    conn: T,
    since: Instant,
}

/// A map by upstream endpoint: the configured upstreams' alone, so hashed
/// with [`crate::fnv`].
type ByUpstream<V> = HashMap<EndpointKey, V, crate::fnv::OwnKeys>;

/// The idle connections of one worker thread, by upstream endpoint.
#[derive(Default)]
struct Shard {
    idle: ByUpstream<Vec<Idle<Conn>>>,
    wire: ByUpstream<Vec<Idle<WireConn>>>,
}

/// Takes out of `lists` the connections idle for `timeout` or more and
/// those no longer ready.
fn expired<T: Link>(
    lists: &mut ByUpstream<Vec<Idle<T>>>,
    now: Instant,
    timeout: Duration,
) -> Vec<Idle<T>> {
    let mut closed = Vec::new();
    lists.retain(|_, list| {
        let mut i = 0;
        while i < list.len() {
            let idle = &mut list[i];
            if now.duration_since(idle.since) >= timeout || !idle.conn.ready_now() {
                closed.push(list.swap_remove(i));
            } else {
                i += 1;
            }
        }
        !list.is_empty()
    });
    closed
}

/// A connection's places under its upstream's ceiling and the total one,
/// and the gate its upstream's waiters watch.
struct Places {
    gate: Arc<Gate>,
    _upstream: OwnedSemaphorePermit,
    _total: OwnedSemaphorePermit,
}

/// The ceiling of one upstream: a permit per open connection, and the
/// requests waiting for one.
struct Gate {
    open: Arc<Semaphore>,
    waiting: AtomicUsize,
    /// Woken when a connection to this upstream goes back to a pool.
    returned: Notify,
}

/// How many connections one upstream may have open, and how requests wait
/// when it has them all.
#[derive(Debug, Clone, Copy)]
pub struct Ceiling {
    pub per_upstream: usize,
    /// All upstreams together; 0: no bound of its own.
    pub total: usize,
    /// Requests waiting at once; more fail at once.
    pub queue: usize,
    /// Longest wait in the queue.
    pub queue_timeout: Duration,
}

#[cfg(test)]
impl Ceiling {
    /// No bound that tests would notice.
    pub const UNBOUNDED: Ceiling = Ceiling {
        per_upstream: Semaphore::MAX_PERMITS,
        total: 0,
        queue: usize::MAX,
        queue_timeout: Duration::from_secs(60),
    };
}

/// Why a request got no response head.
#[derive(Debug)]
pub enum SendError {
    /// No connection could be opened (refused, unreachable, timed out).
    Connect(std::io::Error),
    /// The TLS handshake with an `https://` upstream failed or timed out.
    Handshake(std::io::Error),
    /// The upstream has its ceiling of connections open, and none came free
    /// in the queue.
    Saturated,
    /// The connection failed while sending or before the head arrived.
    Request(hyper::Error),
    /// The same, on a connection spoken to with [`wire`].
    Wire(WireError),
    /// Writing the request failed.
    Write(std::io::Error),
    /// Reading the response head failed.
    Read(std::io::Error),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Connect(e) => write!(f, "connecting to the upstream: {e}"),
            SendError::Handshake(e) => write!(f, "TLS handshake with the upstream: {e}"),
            SendError::Saturated => f.write_str("the upstream has all its connections in use"),
            SendError::Request(e) => write!(f, "upstream request: {e}"),
            SendError::Wire(e) => write!(f, "upstream request: {e}"),
            SendError::Write(e) => write!(f, "upstream request: writing: {e}"),
            SendError::Read(e) => write!(f, "upstream request: reading: {e}"),
        }
    }
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendError::Connect(e) | SendError::Handshake(e) => Some(e),
            SendError::Saturated => None,
            SendError::Request(e) => Some(e),
            SendError::Wire(e) => Some(e),
            SendError::Write(e) => Some(e),
            SendError::Read(e) => Some(e),
        }
    }
}

pub struct UpstreamClient {
    shards: Box<[Mutex<Shard>]>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    /// Idle connections kept per upstream in each shard.
    max_idle_per_shard: usize,
    ceiling: Ceiling,
    /// A permit per connection open to any upstream.
    total: Arc<Semaphore>,
    /// One per upstream authority, made when it is first used.
    gates: Mutex<HashMap<Authority, Arc<Gate>, crate::fnv::OwnKeys>>,
}

thread_local! {
    /// The pool of a worker thread, set once when it starts.
    static PINNED: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Makes the calling thread (a worker) use pool `index` of every client,
/// and that pool alone.
pub(crate) fn pin_thread_to_pool(index: usize) {
    PINNED.with(|pinned| pinned.set(Some(index)));
}

/// Which shard the current thread uses, and whether it is its own: a worker
/// uses the pool it was pinned to; other threads take one in turn the first
/// time.
fn shard_index(shards: usize) -> (usize, bool) {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    match PINNED.with(std::cell::Cell::get) {
        Some(index) => (index % shards, true),
        None => (SLOT.with(|slot| *slot % shards), false),
    }
}

impl UpstreamClient {
    /// `max_idle_per_host` idle connections per upstream at most, split over
    /// the shards (one per worker thread).
    pub fn new(
        connect_timeout: Duration,
        idle_timeout: Duration,
        max_idle_per_host: usize,
        shards: usize,
        ceiling: Ceiling,
    ) -> Arc<UpstreamClient> {
        let shards = shards.max(1);
        let client = Arc::new(UpstreamClient {
            shards: (0..shards).map(|_| Mutex::default()).collect(),
            connect_timeout,
            idle_timeout,
            max_idle_per_shard: max_idle_per_host.div_ceil(shards),
            ceiling,
            total: Arc::new(Semaphore::new(match ceiling.total {
                0 => Semaphore::MAX_PERMITS,
                n => n.min(Semaphore::MAX_PERMITS),
            })),
            gates: Mutex::default(),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let weak = Arc::downgrade(&client);
            let period =
                (idle_timeout / 2).clamp(Duration::from_millis(10), Duration::from_secs(30));
            runtime.spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(client) = weak.upgrade() else { return };
                    client.sweep();
                }
            });
        }
        client
    }

    fn shard(&self) -> std::sync::MutexGuard<'_, Shard> {
        self.shards[shard_index(self.shards.len()).0]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Closes connections idle for longer than the idle timeout, and those the
    /// upstream closed.
    fn sweep(&self) {
        let now = Instant::now();
        for shard in self.shards.iter() {
            let closed = {
                let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
                (
                    expired(&mut shard.idle, now, self.idle_timeout),
                    expired(&mut shard.wire, now, self.idle_timeout),
                )
            };
            // Dropped outside the lock: closing a socket is a system call.
            drop(closed);
        }
    }

    /// The most recently used idle connection to `endpoint` that is ready
    /// for a request. A worker takes from its own pool only: its connections
    /// come back there, and another thread's would wake across threads.
    /// Any other thread looks in its pool first, else in the others: on a
    /// work-stealing runtime a response body often ends on another thread
    /// than the one its request started on, and looking in one pool alone let
    /// the others fill to their cap with connections no one took (128 idle
    /// upstream connections, 18 MiB more resident, in a one-minute soak of six
    /// sequential clients).
    fn checkout<T: Link>(&self, endpoint: &Endpoint) -> Option<T> {
        let (own, pinned) = shard_index(self.shards.len());
        if pinned {
            return self.checkout_from(own, endpoint);
        }
        (0..self.shards.len())
            .map(|i| (own + i) % self.shards.len())
            .find_map(|i| self.checkout_from(i, endpoint))
    }

    /// Any pool's idle connection: for a request waiting at the ceiling,
    /// which takes whatever came back, wherever.
    fn checkout_any<T: Link>(&self, endpoint: &Endpoint) -> Option<T> {
        let own = shard_index(self.shards.len()).0;
        (0..self.shards.len())
            .map(|i| (own + i) % self.shards.len())
            .find_map(|i| self.checkout_from(i, endpoint))
    }

    fn checkout_from<T: Link>(&self, shard: usize, endpoint: &Endpoint) -> Option<T> {
        let now = Instant::now();
        let mut dropped = Vec::new();
        let found = {
            let mut shard = self.shards[shard].lock().unwrap_or_else(|p| p.into_inner());
            let list = T::idle(&mut shard).get_mut(endpoint.key())?;
            let mut found = None;
            while let Some(mut idle) = list.pop() {
                if now.duration_since(idle.since) < self.idle_timeout && idle.conn.ready_now() {
                    found = Some(idle.conn);
                    break;
                }
                dropped.push(idle);
            }
            found
        };
        drop(dropped);
        found
    }

    /// Puts a connection whose exchange is over back in the pool.
    fn release<T: Link>(&self, key: EndpointKey, mut conn: T) {
        if self.max_idle_per_shard == 0 || !conn.settled() {
            return;
        }
        // The gate travels with the connection: no lookup on this path,
        // which every request with a body takes.
        let gate = conn.places().gate.clone();
        {
            let mut shard = self.shard();
            let list = T::idle(&mut shard).entry(key).or_default();
            if list.len() >= self.max_idle_per_shard {
                return;
            }
            list.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
        if gate.waiting.load(Ordering::Relaxed) > 0 {
            gate.returned.notify_waiters();
        }
    }

    /// Places for a new connection through `gate`, if both are free now.
    fn try_places(&self, gate: &Arc<Gate>) -> Option<Places> {
        let upstream = gate.open.clone().try_acquire_owned().ok()?;
        let total = self.total.clone().try_acquire_owned().ok()?;
        Some(Places {
            gate: gate.clone(),
            _upstream: upstream,
            _total: total,
        })
    }

    /// Places for a new connection through `gate`, once both come free.
    async fn places(&self, gate: &Arc<Gate>) -> Result<Places, SendError> {
        let upstream = gate.open.clone().acquire_owned().await;
        let total = self.total.clone().acquire_owned().await;
        match (upstream, total) {
            (Ok(upstream), Ok(total)) => Ok(Places {
                gate: gate.clone(),
                _upstream: upstream,
                _total: total,
            }),
            _ => Err(SendError::Saturated),
        }
    }

    /// The ceiling of `authority`'s upstream, whatever its TLS.
    fn gate(&self, authority: &Authority) -> Arc<Gate> {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(gate) = gates.get(authority) {
            return gate.clone();
        }
        let gate = Arc::new(Gate {
            open: Arc::new(Semaphore::new(
                self.ceiling.per_upstream.min(Semaphore::MAX_PERMITS),
            )),
            waiting: AtomicUsize::new(0),
            returned: Notify::new(),
        });
        gates.insert(authority.clone(), gate.clone());
        gate
    }

    /// A connection to `endpoint`: an idle one, else a new one under the
    /// upstream's ceiling; at the ceiling, the first to come back to any
    /// pool or the place of one that closed, within the queue's bounds.
    async fn obtain<T: Link, Other: Link>(
        &self,
        endpoint: &Endpoint,
    ) -> Result<(T, bool), SendError> {
        if let Some(conn) = self.checkout(endpoint) {
            return Ok((conn, true));
        }
        let gate = self.gate(endpoint.authority());
        if let Some(open) = self.try_places(&gate) {
            return Ok((self.connect(endpoint, open).await?, false));
        }
        if gate.waiting.fetch_add(1, Ordering::Relaxed) >= self.ceiling.queue {
            gate.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(SendError::Saturated);
        }
        let waited = tokio::time::timeout(self.ceiling.queue_timeout, async {
            loop {
                let returned = gate.returned.notified();
                if let Some(conn) = self.checkout_any(endpoint) {
                    return Ok::<_, SendError>((conn, true));
                }
                // An idle connection of the other kind is closed: its place
                // is taken by a new one of this kind.
                drop(self.checkout_any::<Other>(endpoint));
                tokio::select! {
                    () = returned => {}
                    open = self.places(&gate) => {
                        return Ok((self.connect(endpoint, open?).await?, false));
                    }
                }
            }
        })
        .await;
        gate.waiting.fetch_sub(1, Ordering::Relaxed);
        waited.unwrap_or(Err(SendError::Saturated))
    }

    async fn connect<T: Link>(&self, endpoint: &Endpoint, open: Places) -> Result<T, SendError> {
        let stream = endpoint
            .open(self.connect_timeout)
            .await
            .map_err(|error| match error {
                OpenError::Connect(e) => SendError::Connect(e),
                OpenError::Handshake(e) => SendError::Handshake(e),
            })?;
        T::open(stream, open).await
    }

    /// Sends `request` to `endpoint` (HTTP/1.1, over TLS to an `https://`
    /// upstream) and waits for the
    /// response head; the body streams from the connection as it is read.
    /// With a response, `keep` moves into its body, dropped when the
    /// exchange ends (at once when there is no body).
    pub async fn send<K: Send + Unpin + 'static>(
        self: &Arc<Self>,
        endpoint: &Endpoint,
        request: Request<Body>,
        keep: &mut Option<K>,
    ) -> Result<Response<Body>, SendError> {
        let (mut conn, reused) = self.obtain::<Conn, WireConn>(endpoint).await?;
        let response = match exchange(&mut conn, request).await {
            Ok(response) => response,
            // A pooled connection that broke before the request was written
            // (the upstream closed it as it was checked out): the request
            // goes again, once, on a new connection.
            Err(mut error) => {
                let Some(request) = reused.then(|| error.take_message()).flatten() else {
                    return Err(SendError::Request(error.into_error()));
                };
                let open = conn.open;
                conn = self.connect(endpoint, open).await?;
                exchange(&mut conn, request)
                    .await
                    .map_err(|e| SendError::Request(e.into_error()))?
            }
        };
        let (head, incoming) = response.into_parts();
        if http_body::Body::is_end_stream(&incoming) {
            self.release(endpoint.key().clone(), conn);
            drop(keep.take());
            return Ok(Response::from_parts(head, body::empty()));
        }
        Ok(Response::from_parts(
            head,
            body::boxed(Pooled {
                incoming,
                conn: Some(conn),
                client: self.clone(),
                key: endpoint.key().clone(),
                _keep: keep.take(),
            }),
        ))
    }
    /// Sends a request whose body is `body`, whole, to `endpoint` with
    /// [`wire`], and waits for the response head; the body streams from
    /// the connection as it is read. `keep` as in [`UpstreamClient::send`].
    pub async fn send_whole<K: Send + Unpin + 'static>(
        self: &Arc<Self>,
        endpoint: &Endpoint,
        head: http::request::Parts,
        added: &Added,
        body: Bytes,
        keep: &mut Option<K>,
    ) -> Result<Response<Body>, SendError> {
        let (mut conn, reused) = self.obtain::<WireConn, Conn>(endpoint).await?;
        let path = head.uri.path_and_query().map_or("/", |p| p.as_str());
        conn.out.clear();
        wire::write_request_head(
            &head.method,
            path,
            &head.headers,
            added,
            body.len(),
            &mut conn.out,
        );
        if let Err(error) = conn.write(&body).await {
            // A pooled connection the upstream closed as it was checked out
            // refuses the write: the request goes again, once, on a new
            // connection, as on hyper's client.
            if !reused {
                return Err(SendError::Write(error));
            }
            conn = self.again(endpoint, conn, &body).await?;
        }
        let response = match conn.read_head().await {
            Ok(response) => response,
            // A pooled connection the upstream closed just as the request
            // went out (its keep-alive ran out): nothing of an answer came.
            // An idempotent request goes again, once, on a new connection
            // (RFC 9112 9.3.1); any other is the upstream's failure.
            Err(SendError::Wire(WireError::Closed) | SendError::Read(_))
                if reused && conn.buf.is_empty() && head.method.is_idempotent() =>
            {
                conn = self.again(endpoint, conn, &body).await?;
                conn.read_head().await?
            }
            Err(error) => return Err(error),
        };
        Ok(self.wire_response(endpoint, conn, response, keep))
    }

    /// The response whose head `conn` read, its body after it in `conn`:
    /// whole when it came with the head or there is none (the connection
    /// given back when it may be), else streamed from the connection.
    fn wire_response<K: Send + Unpin + 'static>(
        self: &Arc<Self>,
        endpoint: &Endpoint,
        mut conn: WireConn,
        response: ResponseHead,
        keep: &mut Option<K>,
    ) -> Response<Body> {
        conn.buf.advance(response.len);
        let mut parts = Response::new(()).into_parts().0;
        parts.status = response.status;
        parts.version = response.version;
        parts.headers = response.headers;
        let reusable = response.reusable;
        let framing = match response.framing {
            Framing::Empty => None,
            Framing::Length(n) if (conn.buf.len() as u64) >= n => {
                // The whole body came with the head: the usual small answer.
                let bytes = conn.buf.split_to(n as usize).freeze();
                if reusable {
                    self.release(endpoint.key().clone(), conn);
                }
                drop(keep.take());
                return Response::from_parts(parts, body::full(bytes));
            }
            Framing::Length(n) => Some(Remaining::Length(n)),
            Framing::Chunked => Some(Remaining::Chunked(Chunked::default())),
            Framing::Close => Some(Remaining::Close),
        };
        let Some(remaining) = framing else {
            if reusable {
                self.release(endpoint.key().clone(), conn);
            }
            drop(keep.take());
            return Response::from_parts(parts, body::empty());
        };
        Response::from_parts(
            parts,
            body::boxed(WireBody {
                conn: Some(conn),
                remaining,
                reusable,
                client: self.clone(),
                key: endpoint.key().clone(),
                _keep: keep.take(),
            }),
        )
    }
}

impl UpstreamClient {
    /// The request written in `conn.out` (its head) and `body`, written
    /// again on a new connection in `conn`'s place under the ceiling.
    async fn again(
        &self,
        endpoint: &Endpoint,
        conn: WireConn,
        body: &Bytes,
    ) -> Result<WireConn, SendError> {
        let WireConn { out, open, .. } = conn;
        let mut fresh: WireConn = self.connect(endpoint, open).await?;
        fresh.out = out;
        fresh.write(body).await.map_err(SendError::Write)?;
        Ok(fresh)
    }
}

/// Bodies larger than this are written after the head, not copied beside it.
const COPY_BODY: usize = 16 * 1024;

impl WireConn {
    /// Writes the head in `out`, then `body`: one write for a small body.
    /// `out` keeps the head alone, for a second attempt.
    async fn write(&mut self, body: &Bytes) -> std::io::Result<()> {
        let head = self.out.len();
        let written = if body.len() <= COPY_BODY {
            self.out.extend_from_slice(body);
            self.stream.write_all(&self.out).await
        } else {
            match self.stream.write_all(&self.out).await {
                Ok(()) => self.stream.write_all(body).await,
                Err(error) => Err(error),
            }
        };
        self.out.truncate(head);
        written?;
        self.stream.flush_tls().await
    }

    /// Reads up to the final response head, skipping 1xx answers other
    /// than 101 (RFC 9110 15.2: a client that did not ask may see them).
    async fn read_head(&mut self) -> Result<ResponseHead, SendError> {
        loop {
            if !self.buf.is_empty() {
                match crate::http1::response::parse(&self.buf, wire::MAX_HEAD)
                    .map_err(|error| SendError::Wire(error.into()))?
                {
                    Some(head)
                        if head.status.is_informational()
                            && head.status != http::StatusCode::SWITCHING_PROTOCOLS =>
                    {
                        self.buf.advance(head.len);
                        continue;
                    }
                    Some(head) => return Ok(head),
                    None => {}
                }
            }
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) => return Err(SendError::Wire(WireError::Closed)),
                Ok(_) => {}
                Err(error) => return Err(SendError::Read(error)),
            }
        }
    }
}

/// What is left of a response body read with [`wire`].
enum Remaining {
    Length(u64),
    Chunked(Chunked),
    Close,
}

/// A response body read from a [`WireConn`], which goes back to the pool
/// once the body has ended (when the response allowed it). Dropped before
/// its end (the client went away), the connection is closed.
struct WireBody<K> {
    /// `None` once given back or closed.
    conn: Option<WireConn>,
    remaining: Remaining,
    reusable: bool,
    client: Arc<UpstreamClient>,
    key: EndpointKey,
    /// What the caller keeps for as long as the exchange lasts.
    _keep: Option<K>,
}

impl<K> WireBody<K> {
    /// The body's next bytes out of what was read, `Ok(None)` when more
    /// must be read first, or at the end (then `conn` was settled).
    fn take(&mut self) -> Result<Option<Bytes>, WireError> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(None);
        };
        let data = match &mut self.remaining {
            Remaining::Length(0) => None,
            Remaining::Length(n) => {
                if conn.buf.is_empty() {
                    return Ok(None);
                }
                let take = (conn.buf.len() as u64).min(*n);
                *n -= take;
                Some(conn.buf.split_to(take as usize).freeze())
            }
            Remaining::Chunked(chunked) => chunked.next(&mut conn.buf)?,
            Remaining::Close => (!conn.buf.is_empty()).then(|| conn.buf.split().freeze()),
        };
        if self.ended() {
            self.settle();
        }
        Ok(data)
    }

    fn ended(&self) -> bool {
        match &self.remaining {
            Remaining::Length(n) => *n == 0,
            Remaining::Chunked(chunked) => chunked.done(),
            // Ended by the connection's end, found when reading.
            Remaining::Close => false,
        }
    }

    /// The body has ended: the connection goes back, or is closed.
    fn settle(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.reusable
        {
            self.client.release(self.key.clone(), conn);
        }
    }
}

impl<K: Unpin> http_body::Body for WireBody<K> {
    type Data = Bytes;
    type Error = WireError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, WireError>>> {
        let this = &mut *self;
        loop {
            match this.take() {
                Err(error) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(error)));
                }
                Ok(Some(data)) if !data.is_empty() => {
                    return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
                }
                Ok(_) => {}
            }
            // A body that ended gave its connection up in `take`.
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            if let Remaining::Length(n) = this.remaining {
                // A large body is read in large reads: each is one frame on
                // to the client (one TLS write of several records) instead
                // of one per 8 KiB.
                conn.buf.reserve(n.min(BODY_READ as u64) as usize);
            }
            let mut read = std::pin::pin!(conn.stream.read_buf(&mut conn.buf));
            match read.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    this.conn = None;
                    return match this.remaining {
                        // The end of the connection ends such a body.
                        Remaining::Close => Poll::Ready(None),
                        _ => Poll::Ready(Some(Err(WireError::Closed))),
                    };
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(_)) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(WireError::Closed)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none() || self.ended()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.remaining {
            Remaining::Length(n) => http_body::SizeHint::with_exact(n),
            _ => http_body::SizeHint::default(),
        }
    }
}

/// Sends one request on `conn`, driving the connection until the response
/// head arrives.
async fn exchange(
    conn: &mut Conn,
    request: Request<Body>,
) -> Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<Body>>> {
    let mut pending = std::pin::pin!(conn.sender.try_send_request(request));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(result) = pending.as_mut().poll(cx) {
            return Poll::Ready(result);
        }
        // The connection ending resolves the pending response with its error.
        conn.drive(cx);
        pending.as_mut().poll(cx)
    })
    .await
}

/// A response body read from a connection that this body drives, and gives
/// back to the pool when the body has ended. Dropped before its end (the
/// client went away), the connection is closed.
struct Pooled<K> {
    incoming: Incoming,
    /// `None` once given back or closed.
    conn: Option<Conn>,
    client: Arc<UpstreamClient>,
    key: EndpointKey,
    /// What the caller keeps for as long as the exchange lasts.
    _keep: Option<K>,
}

impl<K: Unpin> http_body::Body for Pooled<K> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(conn) = this.conn.as_mut() {
            // Reads the body from the socket into `incoming`; a connection
            // that ended has handed over all it had.
            if !conn.drive(cx) {
                this.conn = None;
            }
        }
        let frame = Pin::new(&mut this.incoming).poll_frame(cx);
        match &frame {
            Poll::Ready(None) => this.give_back(),
            Poll::Ready(Some(Ok(_))) if this.incoming.is_end_stream() => this.give_back(),
            Poll::Ready(Some(Err(_))) => this.conn = None,
            _ => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.incoming.size_hint()
    }
}

impl<K> Pooled<K> {
    fn give_back(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if conn.ready_now() || conn.driver.is_none() {
            self.client.release(self.key.clone(), conn);
            return;
        }
        // The response ended before the request's body was all sent: an
        // upstream that answers first and reads (or discards) the body
        // after, as nginx's `return` does. The body goes on being sent, on
        // a task of its own: left in the pool undriven, it was read from
        // the client no more, and the client's next request on the same
        // connection waited until keygate's body deadline closed it. The
        // client's pace bounds it as any request body's is.
        let (client, key) = (self.client.clone(), self.key.clone());
        tokio::spawn(async move {
            if std::future::poll_fn(|cx| conn.poll_idle(cx)).await {
                client.release(key, conn);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use std::sync::atomic::AtomicUsize;
    use tokio::net::TcpListener;

    /// The plain endpoint at `addr`.
    fn plain(addr: std::net::SocketAddr) -> Endpoint {
        Endpoint::new(addr.to_string().parse().unwrap(), false, None)
    }

    /// A client on two pools, without ceilings, keeping `max_idle` idle
    /// connections per upstream.
    fn client_keeping(max_idle: usize) -> Arc<UpstreamClient> {
        UpstreamClient::new(
            Duration::from_secs(1),
            Duration::from_secs(60),
            max_idle,
            2,
            Ceiling::UNBOUNDED,
        )
    }

    /// A loopback upstream answering every request with `ok` (keep-alive, or
    /// closing after each answer), counting the connections it accepted.
    async fn upstream(close_after_each: bool) -> (Endpoint, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = plain(listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    // Where the search for a head's end goes on from: bytes
                    // of a body it skips (it answers after the head, as
                    // nginx's `return` does) are not searched again.
                    let mut searched = 0;
                    loop {
                        let Ok(n) = stream.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf[searched..]
                            .windows(4)
                            .position(|w| w == b"\r\n\r\n")
                            .map(|at| searched + at)
                        {
                            buf.drain(..end + 4);
                            searched = 0;
                            let answer: &[u8] = if close_after_each {
                                b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nok\n"
                            } else {
                                b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n"
                            };
                            if stream.write_all(answer).await.is_err() || close_after_each {
                                return;
                            }
                        }
                        searched = buf.len().saturating_sub(3);
                    }
                });
            }
        });
        (endpoint, accepted)
    }

    async fn get(client: &Arc<UpstreamClient>, endpoint: &Endpoint) -> String {
        let request = Request::builder()
            .uri(format!("http://{}/x", endpoint.authority()))
            .header("host", endpoint.authority().as_str())
            .body(body::empty())
            .unwrap();
        let response = client
            .send(endpoint, request, &mut None::<()>)
            .await
            .unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn keep_alive_connections_are_reused() {
        let (endpoint, accepted) = upstream(false).await;
        let client = client_keeping(8);
        for _ in 0..5 {
            assert_eq!(get(&client, &endpoint).await, "ok\n");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_body_still_being_sent_when_the_answer_ended_is_sent_to_its_end() {
        // The upstream answers after the head and reads the body after (as
        // nginx's `return` does); the body is larger than the sockets hold.
        let (endpoint, accepted) = upstream(false).await;
        let client = client_keeping(8);
        let (chunks, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            let chunk = rx.recv().await?;
            Some((
                Ok::<_, crate::body::BoxError>(http_body::Frame::data(chunk)),
                rx,
            ))
        });
        let request = Request::builder()
            .method("POST")
            .uri(format!("http://{}/x", endpoint.authority()))
            .header("host", endpoint.authority().as_str())
            .header("content-length", (64 * 65_536).to_string())
            .body(body::boxed(http_body_util::StreamBody::new(stream)))
            .unwrap();
        let feeding = tokio::spawn(async move {
            for _ in 0..64 {
                chunks.send(Bytes::from(vec![b'x'; 65_536])).await.unwrap();
            }
        });
        let response = client
            .send(&endpoint, request, &mut None::<()>)
            .await
            .unwrap();
        let answer = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&answer[..], b"ok\n");
        // Every chunk is taken, with no one reading the response any more.
        tokio::time::timeout(Duration::from_secs(5), feeding)
            .await
            .expect("the rest of the body was never sent")
            .unwrap();
        // And the connection, its exchange over, serves the next request.
        let next = tokio::time::timeout(Duration::from_secs(5), get(&client, &endpoint)).await;
        assert_eq!(next.expect("the next request waited").as_str(), "ok\n");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    async fn get_whole(client: &Arc<UpstreamClient>, endpoint: &Endpoint) -> String {
        let head = Request::builder()
            .uri("/x")
            .header("host", endpoint.authority().as_str())
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let response = client
            .send_whole(
                endpoint,
                head,
                &Added::default(),
                Bytes::new(),
                &mut None::<()>,
            )
            .await
            .unwrap();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn wire_connections_are_reused_and_kept_apart_from_hypers() {
        let (endpoint, accepted) = upstream(false).await;
        let client = client_keeping(8);
        for _ in 0..5 {
            assert_eq!(get_whole(&client, &endpoint).await, "ok\n");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        // hyper's client does not take the wire connection, nor the reverse.
        assert_eq!(get(&client, &endpoint).await, "ok\n");
        assert_eq!(get_whole(&client, &endpoint).await, "ok\n");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn wire_connections_the_upstream_closes_are_not_reused() {
        let (endpoint, accepted) = upstream(true).await;
        let client = client_keeping(8);
        for _ in 0..3 {
            assert_eq!(get_whole(&client, &endpoint).await, "ok\n");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn at_the_ceiling_an_idle_connection_of_the_other_kind_gives_its_place() {
        let (endpoint, accepted) = upstream(false).await;
        let client = one_connection(4);
        assert_eq!(get(&client, &endpoint).await, "ok\n");
        // The one place is held by an idle hyper connection: the wire
        // request closes it and opens its own, rather than wait it out.
        let answer = tokio::time::timeout(Duration::from_secs(5), get_whole(&client, &endpoint))
            .await
            .expect("not left waiting at the ceiling");
        assert_eq!(answer, "ok\n");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn no_idle_connections_kept_when_the_pool_size_is_zero() {
        let (endpoint, accepted) = upstream(false).await;
        let client = client_keeping(0);
        for _ in 0..3 {
            assert_eq!(get(&client, &endpoint).await, "ok\n");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn idle_connections_expire() {
        let (endpoint, accepted) = upstream(false).await;
        let client = UpstreamClient::new(
            Duration::from_secs(1),
            Duration::from_millis(50),
            8,
            2,
            Ceiling::UNBOUNDED,
        );
        assert_eq!(get(&client, &endpoint).await, "ok\n");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            client
                .shards
                .iter()
                .all(|s| s.lock().unwrap().idle.is_empty()),
            "the sweep closed the idle connection"
        );
        assert_eq!(get(&client, &endpoint).await, "ok\n");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn connections_the_upstream_closes_are_not_reused() {
        let (endpoint, accepted) = upstream(true).await;
        let client = client_keeping(8);
        for _ in 0..3 {
            assert_eq!(get(&client, &endpoint).await, "ok\n");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    /// A client whose upstreams may have one connection open, with a queue
    /// of `queue` requests waiting up to five seconds.
    fn one_connection(queue: usize) -> Arc<UpstreamClient> {
        let ceiling = Ceiling {
            per_upstream: 1,
            total: 0,
            queue,
            queue_timeout: Duration::from_secs(5),
        };
        UpstreamClient::new(
            Duration::from_secs(1),
            Duration::from_secs(60),
            8,
            2,
            ceiling,
        )
    }

    fn request_to(endpoint: &Endpoint) -> Request<Body> {
        Request::builder()
            .uri(format!("http://{}/x", endpoint.authority()))
            .body(body::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn at_the_ceiling_a_request_waits_for_a_connection_to_come_back() {
        let (endpoint, accepted) = upstream(false).await;
        let client = one_connection(4);
        // The first exchange holds the one connection until its body is read.
        let first = client
            .send(&endpoint, request_to(&endpoint), &mut None::<()>)
            .await
            .unwrap();
        let waiting = {
            let (client, endpoint) = (client.clone(), endpoint.clone());
            let request = request_to(&endpoint);
            tokio::spawn(async move { client.send(&endpoint, request, &mut None::<()>).await })
        };
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "the second request waits at the ceiling"
        );
        first.into_body().collect().await.unwrap();
        let second = waiting.await.unwrap().unwrap();
        second.into_body().collect().await.unwrap();
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "the connection that came back was used"
        );
    }

    #[tokio::test]
    async fn past_the_queue_a_request_at_the_ceiling_is_refused_at_once() {
        let (endpoint, _accepted) = upstream(false).await;
        let client = one_connection(0);
        let _held = client
            .send(&endpoint, request_to(&endpoint), &mut None::<()>)
            .await
            .unwrap();
        assert!(matches!(
            client
                .send(&endpoint, request_to(&endpoint), &mut None::<()>)
                .await,
            Err(SendError::Saturated)
        ));
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = plain(listener.local_addr().unwrap());
        drop(listener);
        let client = client_keeping(8);
        let request = Request::builder()
            .uri(format!("http://{}/x", endpoint.authority()))
            .body(body::empty())
            .unwrap();
        assert!(matches!(
            client.send(&endpoint, request, &mut None::<()>).await,
            Err(SendError::Connect(_))
        ));
    }
}
