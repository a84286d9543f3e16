//! The lean HTTP/1.1 path: proxied requests served without hyper's server.
//!
//! A connection that starts with an HTTP/1.1 request head is read here
//! first. The head is parsed once, by the HTTP/1.1 codec
//! ([`crate::http1::request`]); when the request is of
//! the common proxied kind (HTTP/1.1, a proxied route, no upgrade, no body or
//! a `Content-Length` body that arrived with its head, nothing ambiguous) it
//! goes through the same phases as every other request: admission and
//! dispatch once, without side effects ([`FastPath::fast_decide`],
//! `App::fast_decide`), then, with what they found, authentication, quotas,
//! the header edits, forwarding and the access log
//! ([`FastPath::fast_handle`], `App::handle_fast`); its response is written
//! here. Anything else is *declined*, before a single byte of it is
//! consumed: hyper gets the connection from that request on, replaying the
//! bytes already read ([`Replay`]), and answers it as it always did. Declines
//! are counted by `keygate_fast_path_declined_total{reason}`.
//!
//! Message framing (RFC 9112 section 6) as enforced here (each rule is the
//! codec's, [`crate::http1`]; a head it finds not plain is declined with
//! the reason it gives):
//!
//! - 6.1: a request carrying `Transfer-Encoding` is not taken at all
//!   ([`Decline::TransferEncoding`]): chunked bodies, and the smuggling a
//!   `Transfer-Encoding` beside a `Content-Length` allows (6.3 rule 3, which
//!   hyper's path refuses with a 400 and closes), stay with hyper.
//! - 6.2 / 6.3 rule 5: `Content-Length` must be one decimal number. A
//!   repeated `Content-Length` (even with equal values), a list, a sign,
//!   spaces inside or anything but digits is not taken ([`Decline::Length`]):
//!   hyper refuses what is invalid.
//! - 6.3 rule 6: a request with neither has no body (length 0).
//! - The body of a taken request is exactly `Content-Length` bytes following
//!   the head; the next request starts right after them. A body that has not
//!   arrived with its head is not taken ([`Decline::BodyPending`]): hyper's
//!   path holds a streaming body to its pace, and reads a small one whole
//!   before anything upstream is taken (`Proxy::buffer`). A
//!   taken request takes no upstream connection before its body is in.
//! - 6.3 for responses: the response written here is framed by its
//!   `Content-Length` when it has one (kept from the upstream), else by the
//!   body's exact size, else chunked; 1xx, 204 and 304 responses have no
//!   body. `HEAD` requests (whose response has a length but no body) are not
//!   taken ([`Decline::Method`]).
//! - A header name that folds to a framing or hop-by-hop one
//!   (`Content_Length`, `Transfer_Encoding`: `_` or another separator read as
//!   `-`) is not taken ([`Decline::FoldedName`]): hyper's path refuses it
//!   with a 400, the one rule for both drivers.
//! - 9.6: after a request or a response saying `Connection: close`, the
//!   response says it too and the connection is closed. A `Connection`
//!   header naming `upgrade` is hyper's.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::BodyExt as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::Handler;
use super::deadlines::{Deadlines, Reason};
use super::peer::Peer;
use crate::body::Body;
use crate::http1::request::{self, NotPlain, Parsed, RequestHead};
use crate::http1::write::{self, BodyFraming};

pub use crate::vocab::decline::Decline;

impl From<NotPlain> for Decline {
    fn from(reason: NotPlain) -> Decline {
        match reason {
            NotPlain::Version => Decline::Version,
            NotPlain::Method => Decline::Method,
            NotPlain::Upgrade => Decline::Upgrade,
            NotPlain::Expect => Decline::Expect,
            NotPlain::TransferEncoding => Decline::TransferEncoding,
            NotPlain::Length => Decline::Length,
            NotPlain::Connection => Decline::Connection,
            NotPlain::Name => Decline::FoldedName,
            NotPlain::Malformed => Decline::Malformed,
        }
    }
}

/// How a connection left the lean path.
pub(super) enum Outcome<I> {
    /// It ended (and why keygate ended it, when it did).
    Closed(Option<Reason>),
    /// A request was declined: hyper serves the connection from here, first
    /// the bytes already read.
    Hyper(Replay<I>),
}

/// Serves the connection's requests on the lean path until one is declined
/// or the connection ends. The deadlines are hyper's: the first head within
/// `deadlines.head` of `opened`, each later one within `deadlines.head` of
/// the previous response (hyper's `header_read_timeout`), bounded by
/// `deadlines.idle`.
pub(super) async fn serve<I, H>(
    mut io: I,
    handler: &Arc<H>,
    conn: &Arc<Peer>,
    opened: Instant,
    deadlines: Deadlines,
    max_head: usize,
    drain: &mut tokio::sync::watch::Receiver<bool>,
) -> Outcome<I>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    // Both buffers are the connection's only while it has a request: an idle
    // keep-alive connection holds neither ([`read_more`], [`write_response`]).
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    // One wait for the drain and one timer for the whole connection, not a
    // new one per request: each new `changed()` put a waiter in the watch's
    // list and took it out again under its lock, and each new timer was
    // registered and cleared (0.6% and 0.5% of samples under
    // `benches/run --perf`).
    let drained_before = *drain.borrow();
    let draining = std::pin::pin!(drain.changed());
    let deadline_timer = std::pin::pin!(tokio::time::sleep_until(opened + deadlines.head));
    let mut between = Between {
        draining,
        deadline_timer,
        drained_before,
        deadlines,
        max_head,
        served: 0,
        since: opened,
    };
    loop {
        let head = match next_head(&mut io, &mut buf, &**handler, &mut between).await {
            Next::Head(head) => head,
            Next::Hyper => return Outcome::Hyper(Replay::new(buf, io)),
            Next::Closed(reason) => return Outcome::Closed(reason),
        };
        let decided = match handler.fast_decide(&head.request, conn) {
            Ok(decided) => decided,
            Err(reason) => {
                handler.fast_declined(reason);
                return Outcome::Hyper(Replay::new(buf, io));
            }
        };
        if buf.len() - head.head_len < head.body_len {
            handler.fast_declined(Decline::BodyPending);
            return Outcome::Hyper(Replay::new(buf, io));
        }
        buf.advance(head.head_len);
        let body = buf.split_to(head.body_len).freeze();
        // Boxed, and lent rather than moved: the request's future is
        // kilobytes, which every connection carried while it waited for its
        // next request (with hyper's below, 9 KB of each idle connection's
        // 24 KB), and each move of it was a copy (`memcpy` under
        // `benches/instructions`).
        let mut handling = Box::pin(handler.fast_handle(head.request, decided, body, conn.clone()));
        let Some(response) = unless_hung_up(&mut io, &mut buf, max_head, handling.as_mut()).await
        else {
            // Dropping the handling cancels the upstream request, and counts
            // it (`keygate_client_aborts_total{reason="gone"}`), as on
            // hyper's path.
            return Outcome::Closed(None);
        };
        if let Err(reason) = answer(&mut io, response, head.close, &mut out).await {
            return Outcome::Closed(reason);
        }
        // Given back between requests (a pipelined request keeps its bytes):
        // holding these two cost each idle TLS keep-alive connection 8 KB of
        // its 32 KB (resident memory over 5,000 idle connections), which a
        // fleet of devices holding connections multiplies. Taking them again
        // costs two allocations per request, served by the allocator's
        // thread cache.
        out = Vec::new();
        if buf.is_empty() {
            buf = BytesMut::new();
        }
        between.served += 1;
        between.since = Instant::now();
    }
}

/// Where a connection on the lean path stands between two requests: what
/// ends the wait for the next head, and since when it is waited for.
struct Between<'a, D> {
    /// The listener's drain began (made once per connection).
    draining: Pin<&'a mut D>,
    /// The head (or idle) deadline (made once per connection).
    deadline_timer: Pin<&'a mut Sleep>,
    /// The drain had begun before the connection was served.
    drained_before: bool,
    deadlines: Deadlines,
    max_head: usize,
    /// Requests answered so far.
    served: u64,
    /// When the wait for the next head began: the connection opened, or the
    /// last response was written.
    since: Instant,
}

impl<D> Between<'_, D> {
    /// Sets the timer to the deadline of the next head.
    fn arm(&mut self) {
        let deadline = if self.served == 0 {
            self.since + self.deadlines.head
        } else {
            self.since + self.deadlines.head.min(self.deadlines.idle)
        };
        if self.deadline_timer.deadline() != deadline {
            self.deadline_timer.as_mut().reset(deadline);
        }
    }

    /// Why the connection ends when the timer fires: idle when nothing of a
    /// next request came.
    fn timed_out(&self, buf: &BytesMut) -> Reason {
        if self.served > 0 && buf.is_empty() {
            Reason::Idle
        } else {
            Reason::HeadTimeout
        }
    }
}

/// What the wait for a request head ended with. Returned once per head and
/// matched at once: boxing the head would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
enum Next {
    /// A plain head, the lean path's to decide on.
    Head(RequestHead),
    /// Declined (and counted): hyper's from here.
    Hyper,
    /// The connection ended (and why keygate ended it, when it did).
    Closed(Option<Reason>),
}

/// Reads until `buf` starts with a whole request head, the client goes, a
/// deadline passes or the listener drains.
async fn next_head<I, H, D>(
    io: &mut I,
    buf: &mut BytesMut,
    handler: &H,
    at: &mut Between<'_, D>,
) -> Next
where
    I: AsyncRead + Unpin,
    H: Handler,
    D: Future,
{
    loop {
        if at.served == 0 && buf.len() >= 3 && buf.starts_with(b"PRI") {
            // The HTTP/2 preface: hyper's.
            return Next::Hyper;
        }
        if !buf.is_empty() {
            match request::parse(buf, at.max_head, crate::identity::folds_to_framing) {
                Parsed::Partial => {}
                Parsed::Plain(head) => return Next::Head(head),
                Parsed::NotPlain(reason) => {
                    handler.fast_declined(reason.into());
                    return Next::Hyper;
                }
            }
        } else if at.served > 0 && at.drained_before {
            return Next::Closed(None);
        }
        at.arm();
        tokio::select! {
            read = read_more(io, buf) => match read {
                Ok(0) | Err(_) => return Next::Closed(None),
                Ok(_) => {}
            },
            () = at.deadline_timer.as_mut() => return Next::Closed(Some(at.timed_out(buf))),
            // A drain that began while a request was answered has
            // notified this wait already: it ends here at once.
            _ = at.draining.as_mut(), if buf.is_empty() && at.served > 0 => {
                return Next::Closed(None);
            }
        }
    }
}

/// Body frames this large are written as they are rather than copied into
/// the response's buffer.
const DIRECT_WRITE: usize = 16 * 1024;

/// What a connection's read buffer, and its response buffer, take when a
/// request starts arriving.
const BUFFER: usize = 8 * 1024;

thread_local! {
    /// Where a connection with no buffer of its own reads: its first bytes
    /// are copied to a buffer taken for them, so a connection that is
    /// waited on holds none.
    static SCRATCH: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0; BUFFER].into_boxed_slice());
}

/// Reads more of the connection into `buf`: into its spare room when it has
/// a buffer, else through the thread's scratch into a buffer taken when
/// bytes came. `Ok(0)` at the end of the stream.
async fn read_more<I: AsyncRead + Unpin>(io: &mut I, buf: &mut BytesMut) -> std::io::Result<usize> {
    if buf.capacity() > buf.len() {
        return io.read_buf(buf).await;
    }
    std::future::poll_fn(|cx| {
        SCRATCH.with_borrow_mut(|scratch| {
            let mut read = ReadBuf::new(scratch);
            std::task::ready!(Pin::new(&mut *io).poll_read(cx, &mut read))?;
            let got = read.filled();
            buf.reserve(BUFFER.max(got.len()));
            buf.extend_from_slice(got);
            Poll::Ready(Ok(got.len()))
        })
    })
    .await
}

/// Writes the response to a request; `Err` with why keygate ended the
/// connection (when it did) once it is closed. After a request or a response
/// saying `Connection: close` the response says it too and the connection
/// is closed.
async fn answer<I>(
    io: &mut I,
    mut response: Response<Body>,
    asked_close: bool,
    out: &mut Vec<u8>,
) -> Result<(), Option<Reason>>
where
    I: AsyncWrite + Unpin,
{
    let close = asked_close
        || response
            .headers()
            .get(header::CONNECTION)
            .is_some_and(|v| v == "close");
    if close {
        // RFC 9112 section 9.6: the last response on the connection says so.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let timed_out = response.status() == StatusCode::REQUEST_TIMEOUT;
    if write_response(io, response, out).await.is_err() {
        return Err(None);
    }
    if close {
        let _ = io.shutdown().await;
        return Err(timed_out.then_some(Reason::BodyTimeout));
    }
    Ok(())
}

/// Waits for `handling` while watching the client: `None` when the client
/// hung up (end of stream, or a broken connection) before the response was
/// ready, `handling` then dropped. Bytes that arrive meanwhile (a pipelined
/// request) are kept in `buf` for the next round, up to `max_head`, past
/// which the client is not read until the response is written (as hyper's
/// path, which reads no further while a request is answered).
///
/// The read costs no system call of its own: the head's read left the
/// socket without readiness, so polling it only registers interest (the
/// `recvfrom` that finds it empty happened anyway, after the response).
async fn unless_hung_up<I, F>(
    io: &mut I,
    buf: &mut BytesMut,
    max_head: usize,
    mut handling: Pin<&mut F>,
) -> Option<Response<Body>>
where
    I: AsyncRead + Unpin,
    F: Future<Output = Response<Body>>,
{
    loop {
        tokio::select! {
            biased;
            response = &mut handling => return Some(response),
            read = io.read_buf(buf), if buf.len() < max_head => match read {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            },
        }
    }
}

/// Writes a response: its head in one buffer with its first body bytes, then
/// each further frame as it comes. Framing as in the module's notes
/// ([`crate::http1::write::response_head`]).
async fn write_response<I>(
    io: &mut I,
    response: Response<Body>,
    out: &mut Vec<u8>,
) -> std::io::Result<()>
where
    I: AsyncWrite + Unpin,
{
    let (parts, mut body) = response.into_parts();
    out.clear();
    out.reserve(BUFFER);
    let framing = write::response_head(&parts, || http_body::Body::size_hint(&body).exact(), out);
    if framing != BodyFraming::None {
        write_body(io, &mut body, framing == BodyFraming::Chunked, out).await?;
    }
    if !out.is_empty() {
        io.write_all(out).await?;
        out.clear();
    }
    io.flush().await
}

/// Appends the body to `out` (after the head in it), frame by frame, each
/// written as it comes but the last, which is left in `out`.
async fn write_body<I>(
    io: &mut I,
    body: &mut Body,
    chunked: bool,
    out: &mut Vec<u8>,
) -> std::io::Result<()>
where
    I: AsyncWrite + Unpin,
{
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(std::io::Error::other)?;
        let Ok(data) = frame.into_data() else {
            // Trailers are not passed on (nor are they by hyper's path
            // to a client that did not ask for them).
            continue;
        };
        if data.is_empty() {
            continue;
        }
        if !chunked && data.len() >= DIRECT_WRITE {
            // A large frame goes to the connection as it is, not copied
            // after what is pending first.
            if !out.is_empty() {
                io.write_all(out).await?;
                out.clear();
            }
            io.write_all(&data).await?;
            continue;
        }
        if chunked {
            crate::http1::write_chunk(&data, out);
        } else {
            out.extend_from_slice(&data);
        }
        if !http_body::Body::is_end_stream(&*body) {
            io.write_all(out).await?;
            out.clear();
        }
    }
    if chunked {
        crate::http1::write_last_chunk(out);
    }
    Ok(())
}

/// A transport that first gives back the bytes the lean path read and did not
/// use, then reads on from the connection.
pub(super) struct Replay<I> {
    buffered: Bytes,
    io: I,
}

impl<I> Replay<I> {
    pub(super) fn new(buffered: BytesMut, io: I) -> Replay<I> {
        Replay {
            buffered: buffered.freeze(),
            io,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Replay<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.buffered.is_empty() {
            let n = self.buffered.len().min(buf.remaining());
            buf.put_slice(&self.buffered[..n]);
            self.buffered.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Replay<I> {
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

/// What a handler does on the lean path; the default declines everything.
pub trait FastPath {
    /// Whether the lean path is on for this handler.
    fn fast_path(&self) -> bool {
        false
    }

    /// What [`FastPath::fast_decide`] found out about a request it took,
    /// handed to [`FastPath::fast_handle`] so that nothing is worked out twice.
    type Decided: Send;

    /// Whether the handler takes this request on the lean path, decided by
    /// the one decision every driver asks (the `decision` module). No side
    /// effect: a declined request is answered by hyper's path, which counts
    /// and logs it.
    fn fast_decide(&self, _req: &Request<()>, _conn: &Peer) -> Result<Self::Decided, Decline> {
        Err(Decline::NotProxied)
    }

    /// Counts a declined request.
    fn fast_declined(&self, _reason: Decline) {}

    /// Answers a request [`FastPath::fast_decide`] took, with its body.
    fn fast_handle(
        &self,
        _req: Request<()>,
        _decided: Self::Decided,
        _body: Bytes,
        _conn: Arc<Peer>,
    ) -> impl Future<Output = Response<Body>> + Send {
        async { crate::error::ApiError::not_found().into_response() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_a_head_is_not_plain_is_a_decline_of_its_own() {
        let reasons = [
            NotPlain::Version,
            NotPlain::Method,
            NotPlain::Upgrade,
            NotPlain::Expect,
            NotPlain::TransferEncoding,
            NotPlain::Length,
            NotPlain::Connection,
            NotPlain::Name,
            NotPlain::Malformed,
        ];
        let labels: Vec<_> = reasons.map(|r| Decline::from(r).label()).to_vec();
        assert_eq!(
            labels,
            [
                "version",
                "method",
                "upgrade",
                "expect",
                "transfer_encoding",
                "content_length",
                "connection",
                "folded_name",
                "malformed"
            ]
        );
    }

    #[test]
    fn a_folded_framing_name_is_declined_as_such() {
        let text = b"POST /api/x HTTP/1.1\r\nContent_Length: 3\r\n\r\n";
        let Parsed::NotPlain(reason) =
            request::parse(text, 16 * 1024, crate::identity::folds_to_framing)
        else {
            panic!("taken")
        };
        assert_eq!(Decline::from(reason), Decline::FoldedName);
    }

    #[tokio::test]
    async fn replay_gives_the_read_bytes_back_first() {
        let (mut near, far) = tokio::io::duplex(64);
        near.write_all(b" world").await.unwrap();
        let mut replay = Replay::new(BytesMut::from(&b"hello"[..]), far);
        let mut got = vec![0u8; 11];
        replay.read_exact(&mut got).await.unwrap();
        assert_eq!(got, b"hello world");
    }
}
