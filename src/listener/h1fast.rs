//! The lean HTTP/1.1 path: proxied requests served without hyper's server.
//!
//! A connection that starts with an HTTP/1.1 request head is read here
//! first. The head is parsed once with `httparse`; when the request is of
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
//! Message framing (RFC 9112 section 6) as enforced here:
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
//!   before anything upstream is taken (`crate::proxy::Proxy::buffer`). A
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
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, Version, header};
use http_body_util::BodyExt as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::time::Instant;

use super::Handler;
use super::peer::Peer;
use super::serve::{Deadlines, Reason};
use crate::body::Body;

/// As many header lines as hyper's server accepts; more is hyper's to refuse.
const MAX_HEADERS: usize = 100;

/// Why the lean path left a request to hyper; the label of
/// `keygate_fast_path_declined_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decline {
    /// Not HTTP/1.1.
    Version,
    /// `HEAD` or `CONNECT`.
    Method,
    /// An `Upgrade` header (WebSockets and the like).
    Upgrade,
    /// An `Expect` header (`100-continue`).
    Expect,
    /// A `Transfer-Encoding` header (chunked bodies, ambiguous framing).
    TransferEncoding,
    /// A `Content-Length` that is not one plain decimal number.
    Length,
    /// The body did not arrive with its head.
    BodyPending,
    /// `Connection: close` or another connection option.
    Connection,
    /// A header name that folds to a framing one (`Content_Length`): hyper's
    /// path refuses it (`proxy::headers::refuse_folded_framing`).
    FoldedName,
    /// The head does not parse, or is over its size limit: hyper answers.
    Malformed,
    /// The path does not normalise.
    Path,
    /// A secret sent in clear (the rule and its counting are hyper's path's).
    InClear,
    /// Not a proxied route: keygate's own endpoints, the API browser, 404s.
    NotProxied,
}

impl Decline {
    pub const ALL: [Decline; 13] = [
        Decline::Version,
        Decline::Method,
        Decline::Upgrade,
        Decline::Expect,
        Decline::TransferEncoding,
        Decline::Length,
        Decline::BodyPending,
        Decline::Connection,
        Decline::FoldedName,
        Decline::Malformed,
        Decline::Path,
        Decline::InClear,
        Decline::NotProxied,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Decline::Version => "version",
            Decline::Method => "method",
            Decline::Upgrade => "upgrade",
            Decline::Expect => "expect",
            Decline::TransferEncoding => "transfer_encoding",
            Decline::Length => "content_length",
            Decline::BodyPending => "body_pending",
            Decline::Connection => "connection",
            Decline::FoldedName => "folded_name",
            Decline::Malformed => "malformed",
            Decline::Path => "path",
            Decline::InClear => "in_clear",
            Decline::NotProxied => "not_proxied",
        }
    }
}

/// A request head the lean path may take: the head as `http` types, how many
/// bytes it took, and the length of its body.
#[derive(Debug)]
pub struct Head {
    pub request: Request<()>,
    pub head_len: usize,
    pub body_len: usize,
    /// The client asked to close the connection after this request.
    pub close: bool,
}

/// What the bytes read so far hold. Returned once per head and matched at
/// once: boxing the head would cost an allocation per request.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Parsed {
    /// Not a whole head yet.
    Partial,
    /// A whole head the lean path may take (the handler still decides).
    Head(Head),
    /// A head (or bytes) the lean path leaves to hyper.
    Declined(Decline),
}

/// Parses the request head at the start of `buf`. `max_head`: the size
/// past which an unfinished head is hyper's to refuse (431).
pub fn parse(buf: &[u8], max_head: usize) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > max_head => {
            return Parsed::Declined(Decline::Malformed);
        }
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Declined(Decline::Malformed),
    };
    match build(&req) {
        Ok((request, body_len, close)) => Parsed::Head(Head {
            request,
            head_len,
            body_len,
            close,
        }),
        Err(decline) => Parsed::Declined(decline),
    }
}

/// The `http` request of a parsed head, its body length and whether it asks
/// to close the connection; or why the lean path leaves it.
fn build(req: &httparse::Request<'_, '_>) -> Result<(Request<()>, usize, bool), Decline> {
    if req.version != Some(1) {
        return Err(Decline::Version);
    }
    let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|_| Decline::Malformed)?;
    if method == Method::HEAD || method == Method::CONNECT {
        return Err(Decline::Method);
    }
    let uri = Uri::try_from(req.path.unwrap_or_default()).map_err(|_| Decline::Malformed)?;
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    let headers = request.headers_mut();
    headers.reserve(req.headers.len());
    let mut length: Option<usize> = None;
    let mut close = false;
    for h in req.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| Decline::Malformed)?;
        let value = HeaderValue::from_bytes(h.value).map_err(|_| Decline::Malformed)?;
        if name == header::TRANSFER_ENCODING {
            return Err(Decline::TransferEncoding);
        }
        if name == header::UPGRADE {
            return Err(Decline::Upgrade);
        }
        if name == header::EXPECT {
            return Err(Decline::Expect);
        }
        if crate::identity::folds_to_framing(&name) {
            return Err(Decline::FoldedName);
        }
        if name == header::CONTENT_LENGTH {
            if length.is_some() {
                return Err(Decline::Length);
            }
            length = Some(content_length(h.value).ok_or(Decline::Length)?);
        }
        if name == header::CONNECTION {
            // The names it lists are removed on the way upstream
            // (`proxy::headers::to_upstream`), as on hyper's path.
            match connection_options(h.value) {
                Some(asks_close) => close |= asks_close,
                None => return Err(Decline::Connection),
            }
        }
        headers.append(name, value);
    }
    Ok((request, length.unwrap_or(0), close))
}

/// One plain decimal number (RFC 9110 section 8.6: `1*DIGIT`), with the
/// optional whitespace around a field value httparse leaves trimmed.
fn content_length(value: &[u8]) -> Option<usize> {
    if value.is_empty() || value.len() > 15 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// Whether a `Connection` header asks to close the connection (a `close`
/// option, any case); `None` for one that names `upgrade` (hyper's).
fn connection_options(value: &[u8]) -> Option<bool> {
    let mut close = false;
    for token in value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
        if token.eq_ignore_ascii_case(b"upgrade") {
            return None;
        }
        close |= token.eq_ignore_ascii_case(b"close");
    }
    Some(close)
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
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let mut out = Vec::with_capacity(8 * 1024);
    let mut served = 0u64;
    let mut since = opened;
    // One wait for the drain and one timer for the whole connection, not a
    // new one per request: each new `changed()` put a waiter in the watch's
    // list and took it out again under its lock, and each new timer was
    // registered and cleared (0.6% and 0.5% of samples under
    // `benches/run --perf`).
    let drained_before = *drain.borrow();
    let mut draining = std::pin::pin!(drain.changed());
    let mut deadline_timer = std::pin::pin!(tokio::time::sleep_until(opened + deadlines.head));
    loop {
        let head = loop {
            if served == 0 && buf.len() >= 3 && buf.starts_with(b"PRI") {
                // The HTTP/2 preface: hyper's.
                return Outcome::Hyper(Replay::new(buf, io));
            }
            if !buf.is_empty() {
                match parse(&buf, max_head) {
                    Parsed::Partial => {}
                    Parsed::Head(head) => break head,
                    Parsed::Declined(reason) => {
                        handler.fast_declined(reason);
                        return Outcome::Hyper(Replay::new(buf, io));
                    }
                }
            } else if served > 0 && drained_before {
                return Outcome::Closed(None);
            }
            let deadline = if served == 0 {
                since + deadlines.head
            } else {
                since + deadlines.head.min(deadlines.idle)
            };
            if deadline_timer.deadline() != deadline {
                deadline_timer.as_mut().reset(deadline);
            }
            tokio::select! {
                read = io.read_buf(&mut buf) => match read {
                    Ok(0) | Err(_) => return Outcome::Closed(None),
                    Ok(_) => {}
                },
                () = &mut deadline_timer => {
                    let reason = if served > 0 && buf.is_empty() {
                        Reason::Idle
                    } else {
                        Reason::HeadTimeout
                    };
                    return Outcome::Closed(Some(reason));
                }
                // A drain that began while a request was answered has
                // notified this wait already: it ends here at once.
                _ = &mut draining, if buf.is_empty() && served > 0 => {
                    return Outcome::Closed(None);
                }
            }
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
        // Pinned where it is made and lent, not moved: the request's future
        // is kilobytes, and each move of it was a copy (`memcpy` under
        // `benches/instructions`).
        let handling =
            std::pin::pin!(handler.fast_handle(head.request, decided, body, conn.clone()));
        let Some(mut response) = unless_hung_up(&mut io, &mut buf, max_head, handling).await else {
            // Dropping the handling cancels the upstream request, and counts
            // it (`keygate_client_aborts_total{reason="gone"}`), as on
            // hyper's path.
            return Outcome::Closed(None);
        };
        let close = head.close
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
        if write_response(&mut io, response, &mut out).await.is_err() {
            return Outcome::Closed(None);
        }
        served += 1;
        since = Instant::now();
        if close {
            let _ = io.shutdown().await;
            return Outcome::Closed(timed_out.then_some(Reason::BodyTimeout));
        }
    }
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
/// each further frame as it comes. Framing as in the module's notes.
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
    let status = parts.status;
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let mut has_length = false;
    for (name, value) in &parts.headers {
        if name == header::TRANSFER_ENCODING {
            // Hop-by-hop; the framing is this writer's.
            continue;
        }
        if name == header::CONTENT_LENGTH {
            // Repeated with one value (the only repetition an upstream
            // response gets through with), it is written once.
            if bodiless || has_length {
                continue;
            }
            has_length = true;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !parts.headers.contains_key(header::DATE) {
        out.extend_from_slice(b"date: ");
        date(out);
        out.extend_from_slice(b"\r\n");
    }
    let mut chunked = false;
    if !bodiless && !has_length {
        match http_body::Body::size_hint(&body).exact() {
            Some(n) => {
                out.extend_from_slice(b"content-length: ");
                out.extend_from_slice(itoa(n, &mut [0u8; 20]));
                out.extend_from_slice(b"\r\n");
            }
            None => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
                chunked = true;
            }
        }
    }
    out.extend_from_slice(b"\r\n");
    if !bodiless {
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
            if chunked {
                out.extend_from_slice(format!("{:X}\r\n", data.len()).as_bytes());
                out.extend_from_slice(&data);
                out.extend_from_slice(b"\r\n");
            } else {
                out.extend_from_slice(&data);
            }
            if !http_body::Body::is_end_stream(&body) {
                io.write_all(out).await?;
                out.clear();
            }
        }
        if chunked {
            out.extend_from_slice(b"0\r\n\r\n");
        }
    }
    if !out.is_empty() {
        io.write_all(out).await?;
        out.clear();
    }
    io.flush().await
}

/// `n` in decimal, in `buf`.
fn itoa(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Appends the HTTP date of now, formatted once a second per thread.
fn date(out: &mut Vec<u8>) {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static CACHED: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != second {
            *cached = (second, httpdate::fmt_http_date(now));
        }
        out.extend_from_slice(cached.1.as_bytes());
    });
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
    /// the one decision every driver asks (`crate::decision`). No side
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

    fn head(text: &str) -> Parsed {
        parse(text.as_bytes(), 16 * 1024)
    }

    #[test]
    fn a_plain_get_is_taken_with_its_headers_in_order() {
        let Parsed::Head(head) = head(
            "GET /api/x?a=1 HTTP/1.1\r\nHost: gw\r\nX-Authorization: ApiKey k\r\nAccept: */*\r\nAccept: a\r\n\r\n",
        ) else {
            panic!("not taken")
        };
        assert_eq!(head.request.method(), Method::GET);
        assert_eq!(head.request.uri(), "/api/x?a=1");
        assert_eq!(head.body_len, 0);
        let names: Vec<_> = head
            .request
            .headers()
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(names, ["host", "x-authorization", "accept", "accept"]);
    }

    #[test]
    fn an_unfinished_head_waits_and_an_oversized_one_is_declined() {
        assert!(matches!(
            head("GET /api/x HTTP/1.1\r\nHost: gw\r\n"),
            Parsed::Partial
        ));
        let long = format!("GET /api/x HTTP/1.1\r\nX: {}", "a".repeat(20_000));
        assert!(matches!(head(&long), Parsed::Declined(Decline::Malformed)));
    }

    #[test]
    fn smuggling_shapes_are_left_to_hyper() {
        for (text, reason) in [
            (
                "POST /api/x HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                Decline::TransferEncoding,
            ),
            (
                "POST /api/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                Decline::TransferEncoding,
            ),
            (
                "POST /api/x HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
                Decline::Length,
            ),
            (
                "POST /api/x HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\n",
                Decline::Length,
            ),
            (
                "POST /api/x HTTP/1.1\r\nContent-Length: +3\r\n\r\n",
                Decline::Length,
            ),
            (
                "POST /api/x HTTP/1.1\r\nContent-Length: 0x3\r\n\r\n",
                Decline::Length,
            ),
            ("GET /api/x HTTP/1.0\r\n\r\n", Decline::Version),
            ("HEAD /api/x HTTP/1.1\r\n\r\n", Decline::Method),
            (
                "GET /api/ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
                Decline::Upgrade,
            ),
            (
                "POST /api/x HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
                Decline::Expect,
            ),
            (
                "GET /api/x HTTP/1.1\r\nConnection: Upgrade\r\n\r\n",
                Decline::Connection,
            ),
            (
                "GET /api/x HTTP/1.1\r\nBad Name: x\r\n\r\n",
                Decline::Malformed,
            ),
            (
                "POST /api/x HTTP/1.1\r\nContent-Length: 3\r\nTransfer_Encoding: chunked\r\n\r\n",
                Decline::FoldedName,
            ),
            (
                "POST /api/x HTTP/1.1\r\nContent_Length: 3\r\n\r\n",
                Decline::FoldedName,
            ),
            (
                "GET /api/x HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
                Decline::Malformed,
            ),
        ] {
            match head(text) {
                Parsed::Declined(got) => assert_eq!(got, reason, "{text:?}"),
                other => panic!("{text:?} was {other:?}"),
            }
        }
    }

    #[test]
    fn connection_close_is_taken_and_remembered() {
        for (text, close) in [
            (
                "GET /api/x HTTP/1.1\r\nConnection: Close, X-Auth-User-Id\r\n\r\n",
                true,
            ),
            (
                "GET /api/x HTTP/1.1\r\nConnection: keep-alive\r\n\r\n",
                false,
            ),
        ] {
            let Parsed::Head(taken) = head(text) else {
                panic!("not taken: {text:?}")
            };
            assert_eq!(taken.close, close, "{text:?}");
        }
    }

    #[test]
    fn a_content_length_body_is_measured() {
        let Parsed::Head(head) = head("POST /api/x HTTP/1.1\r\nContent-Length: 12\r\n\r\n") else {
            panic!("not taken")
        };
        assert_eq!(head.body_len, 12);
        assert_eq!(content_length(b"00012"), Some(12));
        assert_eq!(content_length(b""), None);
        assert_eq!(content_length(b"1 2"), None);
        assert_eq!(content_length(b"99999999999999999999"), None);
    }

    #[test]
    fn numbers_are_written_in_decimal() {
        for n in [0u64, 7, 10, 1234567890, u64::MAX] {
            assert_eq!(itoa(n, &mut [0; 20]), n.to_string().as_bytes());
        }
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

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any bytes: the parser answers (never panics), and a head it
            /// takes is a whole HTTP/1.1 head with one plain length.
            #[test]
            fn the_head_parser_never_panics_and_takes_only_plain_heads(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                if let Parsed::Head(head) = parse(&bytes, 16 * 1024) {
                    prop_assert!(head.head_len <= bytes.len());
                    prop_assert!(bytes[..head.head_len].ends_with(b"\n"));
                    prop_assert!(!head.request.headers().contains_key(header::TRANSFER_ENCODING));
                    prop_assert!(head.request.headers().get_all(header::CONTENT_LENGTH).iter().count() <= 1);
                }
            }

            /// Generated heads of header lines: taken exactly when nothing
            /// in them is a reason to decline, with the length they state.
            #[test]
            fn generated_heads_are_taken_or_declined_by_their_framing(
                names in proptest::collection::vec(prop_oneof![
                    Just("accept"), Just("content-length"), Just("transfer-encoding"),
                    Just("x-custom"), Just("connection"), Just("upgrade"), Just("Content-Length"),
                ], 0..6),
                values in proptest::collection::vec(prop_oneof![
                    Just("5"), Just("chunked"), Just("keep-alive"), Just("close"), Just("x"), Just("5, 5"),
                ], 6),
            ) {
                let mut text = String::from("POST /api/x HTTP/1.1\r\n");
                for (name, value) in names.iter().zip(&values) {
                    text.push_str(&format!("{name}: {value}\r\n"));
                }
                text.push_str("\r\n");
                let lengths: Vec<&str> = names.iter().zip(&values)
                    .filter(|(n, _)| n.eq_ignore_ascii_case("content-length")).map(|(_, v)| *v).collect();
                let expected_ok = !names.iter().any(|n| *n == "transfer-encoding" || *n == "upgrade")
                    && lengths.len() <= 1
                    && lengths.iter().all(|v| *v == "5");
                match parse(text.as_bytes(), 16 * 1024) {
                    Parsed::Head(head) => {
                        prop_assert!(expected_ok, "{text:?}");
                        prop_assert_eq!(head.body_len, if lengths.is_empty() { 0 } else { 5 });
                        prop_assert_eq!(head.head_len, text.len());
                    }
                    Parsed::Declined(_) => prop_assert!(!expected_ok, "{text:?}"),
                    Parsed::Partial => prop_assert!(false, "partial: {text:?}"),
                }
            }
        }
    }
}
