//! HTTP/1.1 towards the upstream without hyper's client: the request head
//! written in one pass into one buffer, the response head parsed once with
//! `httparse`, and the response body relayed by its framing.
//!
//! Used for requests whose body is read whole before they are forwarded
//! (the lean path's, with their head, [`crate::listener::h1fast`]; small
//! bodies on hyper's path, [`super::buffering`]); streamed bodies keep
//! hyper's client.
//! What it saves is hyper's client dispatch for every such request: a channel
//! send and receive, a oneshot for the answer, and the wakes between them
//! (BENCHMARKS.md, "The lean HTTP/1.1 path").
//!
//! Response framing (RFC 9112 section 6.3), as hyper's client reads it, so
//! that either client gives the proxy the same response:
//!
//! - rule 1: a 1xx other than 101, a 204 and a 304 have no body; a 1xx other
//!   than 101 is skipped and the final response read after it. A 101 ends
//!   the exchange (nothing asked for it: the proxy refuses it) and its
//!   connection is not reused.
//! - rule 3: a `Transfer-Encoding` whose last coding is `chunked` frames the
//!   body in chunks; any other `Transfer-Encoding` makes the body run to the
//!   end of the connection. Either way a `Content-Length` beside it is
//!   ignored for framing (and removed before the response goes on:
//!   `proxy::headers::to_client`).
//! - rule 5: a `Content-Length` must be one number; repeated with equal
//!   values it is that number, with different values or anything but digits
//!   the response is refused.
//! - rule 8: with neither, the body runs to the end of the connection, which
//!   is then not reused.
//!
//! A connection goes back to its pool only when the response said nothing
//! against it (`Connection: close`, HTTP/1.0 without `keep-alive`), its body
//! was read to its end, and nothing followed the body.

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Version, header};

use super::headers::Added;

/// As many response header lines as hyper's client accepts.
const MAX_HEADERS: usize = 100;

/// The largest response head read, as hyper's client's read buffer
/// (8 KiB + 100 x 4 KiB).
pub const MAX_HEAD: usize = 8192 + 4096 * 100;

/// Why an upstream response could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The head does not parse, or is over [`MAX_HEAD`].
    Head(&'static str),
    /// The connection ended before the response (or its body) was whole.
    Closed,
    /// A chunk of the body is malformed.
    Chunk(&'static str),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Head(why) => write!(f, "invalid upstream response head: {why}"),
            WireError::Closed => f.write_str("the upstream closed the connection mid-response"),
            WireError::Chunk(why) => write!(f, "invalid chunk in the upstream response: {why}"),
        }
    }
}

impl std::error::Error for WireError {}

/// Appends the request head: request line, `headers` in their map's order
/// (each name's values together, as hyper's client writes them), then what
/// keygate `added` (as hyper's client gets them, appended to the map), and
/// a `content-length` when the body has bytes and the headers state none.
pub fn write_request_head(
    method: &http::Method,
    path_and_query: &str,
    headers: &HeaderMap,
    added: &Added,
    body_len: usize,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(path_and_query.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut line = |name: &HeaderName, value: &HeaderValue| {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    };
    for (name, value) in headers {
        line(name, value);
    }
    added.each(line);
    if body_len > 0 && !headers.contains_key(header::CONTENT_LENGTH) {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(body_len.to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (rule 1).
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// To the end of the connection.
    Close,
}

/// A parsed response head.
#[derive(Debug)]
pub struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    /// Bytes the head took, from the start of the buffer it was parsed in.
    pub len: usize,
    pub framing: Framing,
    /// The connection may carry another request after this response.
    pub reusable: bool,
}

/// Parses the response head at the start of `buf`: `Ok(None)` while it is
/// not whole.
pub fn parse_response(buf: &[u8]) -> Result<Option<ResponseHead>, WireError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut slots);
    let len = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err(WireError::Head("too large"));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(WireError::Head("too many headers")),
        Err(_) => return Err(WireError::Head("malformed")),
    };
    if len > MAX_HEAD {
        return Err(WireError::Head("too large"));
    }
    let status = StatusCode::from_u16(response.code.unwrap_or_default())
        .map_err(|_| WireError::Head("bad status"))?;
    let version = match response.version {
        Some(1) => Version::HTTP_11,
        _ => Version::HTTP_10,
    };
    let mut headers = HeaderMap::with_capacity(response.headers.len());
    let mut length: Option<u64> = None;
    let mut bad_length = false;
    let mut transfer_encoding = false;
    let mut chunked = false;
    let mut close = false;
    let mut keep_alive = false;
    for h in response.headers.iter() {
        let name =
            HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| WireError::Head("bad name"))?;
        let value = HeaderValue::from_bytes(h.value).map_err(|_| WireError::Head("bad value"))?;
        if name == header::CONTENT_LENGTH {
            match content_length(h.value) {
                Some(n) if length.is_none_or(|m| m == n) => length = Some(n),
                _ => bad_length = true,
            }
        } else if name == header::TRANSFER_ENCODING {
            transfer_encoding = true;
            // The last coding of the last field decides (RFC 9112 6.1).
            chunked = h
                .value
                .rsplit(|b| *b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name == header::CONNECTION {
            for token in h.value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                close |= token.eq_ignore_ascii_case(b"close");
                keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        }
        headers.append(name, value);
    }
    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let framing = if bodiless {
        Framing::Empty
    } else if transfer_encoding {
        if version == Version::HTTP_10 {
            return Err(WireError::Head("transfer-encoding in HTTP/1.0"));
        }
        if chunked {
            Framing::Chunked
        } else {
            Framing::Close
        }
    } else if bad_length {
        return Err(WireError::Head("invalid content-length"));
    } else {
        match length {
            Some(n) => Framing::Length(n),
            None => Framing::Close,
        }
    };
    let reusable = framing != Framing::Close
        && status != StatusCode::SWITCHING_PROTOCOLS
        && !close
        && (version == Version::HTTP_11 || keep_alive);
    Ok(Some(ResponseHead {
        status,
        version,
        headers,
        len,
        framing,
        reusable,
    }))
}

/// One plain decimal number (RFC 9110 8.6), as the field value httparse
/// leaves trimmed.
fn content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// Reads a chunked body out of a buffer, a piece at a time (RFC 9112 7.1):
/// `chunk-size [ chunk-ext ] CRLF chunk-data CRLF`, ended by a zero-size
/// chunk, trailer lines (read and dropped, as hyper's path drops them for a
/// client that did not ask) and an empty line.
#[derive(Debug, Default)]
pub struct Chunked {
    state: ChunkState,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Before a chunk-size line.
    #[default]
    Size,
    /// Within chunk data, this many bytes left.
    Data(u64),
    /// The CRLF after chunk data.
    DataEnd,
    /// After the last chunk: trailer lines up to an empty one.
    Trailers,
    /// The body is whole.
    Done,
}

/// Longest chunk-size line (with extensions) or trailer line read.
const MAX_LINE: usize = 4096;

impl Chunked {
    /// Whether the body's last chunk and trailers have been read.
    pub fn done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Takes what it can from `buf`: `Ok(Some(data))` for body bytes,
    /// `Ok(None)` when it needs more bytes (or is done), an error for a
    /// malformed chunk.
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, WireError> {
        loop {
            match self.state {
                ChunkState::Done => return Ok(None),
                ChunkState::Size => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(None);
                    };
                    let digits = line[..]
                        .split(|b: &u8| *b == b';')
                        .next()
                        .unwrap_or_default();
                    let digits = digits.trim_ascii_end();
                    if digits.is_empty()
                        || digits.len() > 15
                        || !digits.iter().all(u8::is_ascii_hexdigit)
                    {
                        return Err(WireError::Chunk("bad chunk size"));
                    }
                    let size = digits.iter().fold(0u64, |n, d| {
                        n * 16 + (*d as char).to_digit(16).unwrap_or(0) as u64
                    });
                    self.state = if size == 0 {
                        ChunkState::Trailers
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = (buf.len() as u64).min(left) as usize;
                    let data = buf.split_to(n).freeze();
                    self.state = if left == n as u64 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left - n as u64)
                    };
                    return Ok(Some(data));
                }
                ChunkState::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(None);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(WireError::Chunk("no CRLF after chunk data"));
                    }
                    buf.advance(2);
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailers => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(None);
                    };
                    if line.is_empty() {
                        self.state = ChunkState::Done;
                    }
                }
            }
        }
    }
}

/// A CRLF-ended line taken from the front of `buf` (without its CRLF), or
/// `None` while it is not whole. A bare LF or an overlong line is refused.
fn take_line(buf: &mut BytesMut) -> Result<Option<BytesMut>, WireError> {
    match buf.iter().position(|b| *b == b'\n') {
        Some(at) => {
            if at == 0 || buf[at - 1] != b'\r' {
                return Err(WireError::Chunk("bare LF"));
            }
            let mut line = buf.split_to(at + 1);
            line.truncate(at - 1);
            Ok(Some(line))
        }
        None if buf.len() > MAX_LINE => Err(WireError::Chunk("line too long")),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> ResponseHead {
        parse_response(text.as_bytes()).unwrap().unwrap()
    }

    #[test]
    fn the_request_head_is_one_buffer_in_header_map_order() {
        let mut headers = HeaderMap::new();
        headers.append("host", HeaderValue::from_static("up"));
        headers.append("accept", HeaderValue::from_static("a"));
        headers.append("x-b", HeaderValue::from_static("1"));
        headers.append("accept", HeaderValue::from_static("b"));
        let mut out = Vec::new();
        write_request_head(
            &http::Method::POST,
            "/api/x?y=1",
            &headers,
            &Added::default(),
            3,
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /api/x?y=1 HTTP/1.1\r\nhost: up\r\naccept: a\r\naccept: b\r\nx-b: 1\r\ncontent-length: 3\r\n\r\n"
        );
    }

    #[test]
    fn response_framing_follows_rfc_9112_section_6_3() {
        let cases = [
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
                Framing::Length(5),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n",
                Framing::Length(5),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                Framing::Chunked,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\ncontent-length: 3\r\n\r\n",
                Framing::Chunked,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
                Framing::Close,
                false,
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", Framing::Close, false),
            (
                "HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n",
                Framing::Empty,
                true,
            ),
            (
                "HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\n\r\n",
                Framing::Empty,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\n",
                Framing::Length(5),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 5\r\n\r\n",
                Framing::Length(5),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 5\r\nconnection: keep-alive\r\n\r\n",
                Framing::Length(5),
                true,
            ),
            (
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n",
                Framing::Empty,
                false,
            ),
        ];
        for (text, framing, reusable) in cases {
            let parsed = head(text);
            assert_eq!(parsed.framing, framing, "{text:?}");
            assert_eq!(parsed.reusable, reusable, "{text:?}");
            assert_eq!(parsed.len, text.len(), "{text:?}");
        }
    }

    #[test]
    fn ambiguous_or_malformed_response_heads_are_refused() {
        for text in [
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nbad name: x\r\n\r\n",
            "HTTP/1.1 200 OK\r\nx: a\r\n b\r\n\r\n",
            "HTTX/1.1 200 OK\r\n\r\n",
        ] {
            assert!(parse_response(text.as_bytes()).is_err(), "{text:?}");
        }
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n")
                .unwrap()
                .is_none()
        );
        let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD + 1));
        assert!(parse_response(huge.as_bytes()).is_err());
    }

    fn dechunk(wire: &[u8], step: usize) -> Result<(Vec<u8>, Vec<u8>), WireError> {
        let mut decoder = Chunked::default();
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        for piece in wire.chunks(step.max(1)) {
            buf.extend_from_slice(piece);
            while let Some(data) = decoder.next(&mut buf)? {
                body.extend_from_slice(&data);
            }
            if decoder.done() {
                break;
            }
        }
        assert!(decoder.done(), "not done: {wire:?}");
        Ok((body, buf.to_vec()))
    }

    #[test]
    fn chunked_bodies_are_read_whatever_the_pieces_they_arrive_in() {
        let wire = b"5\r\nfirst\r\n6;ext=1\r\nsecond\r\n0\r\ntrailer: x\r\n\r\nNEXT";
        for step in [1, 2, 3, 7, wire.len()] {
            let (body, rest) = dechunk(wire, step).unwrap();
            assert_eq!(body, b"firstsecond", "step {step}");
            if step == wire.len() {
                assert_eq!(rest, b"NEXT");
            }
        }
    }

    #[test]
    fn malformed_chunks_are_refused() {
        for wire in [
            &b"x\r\nabc\r\n0\r\n\r\n"[..],
            b"3\r\nabcX\r\n0\r\n\r\n",
            b"3\nabc\r\n0\r\n\r\n",
            b"-3\r\nabc\r\n0\r\n\r\n",
            b"ffffffffffffffff\r\n",
            b"\r\n",
        ] {
            let mut decoder = Chunked::default();
            let mut buf = BytesMut::from(wire);
            let mut failed = false;
            for _ in 0..8 {
                match decoder.next(&mut buf) {
                    Err(_) => {
                        failed = true;
                        break;
                    }
                    Ok(None) => break,
                    Ok(Some(_)) => {}
                }
            }
            assert!(failed, "{wire:?}");
        }
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any body, chunked in any sizes and fed in any pieces, comes
            /// back whole; the bytes after it are left in the buffer.
            #[test]
            fn any_chunking_of_any_body_decodes_to_that_body(
                body in proptest::collection::vec(any::<u8>(), 0..600),
                sizes in proptest::collection::vec(1usize..50, 1..20),
                step in 1usize..64,
            ) {
                let mut wire = Vec::new();
                let mut at = 0;
                let mut i = 0;
                while at < body.len() {
                    let n = sizes[i % sizes.len()].min(body.len() - at);
                    wire.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                    wire.extend_from_slice(&body[at..at + n]);
                    wire.extend_from_slice(b"\r\n");
                    at += n;
                    i += 1;
                }
                wire.extend_from_slice(b"0\r\n\r\nREST");
                let mut decoder = Chunked::default();
                let mut buf = BytesMut::new();
                let mut got = Vec::new();
                for piece in wire.chunks(step) {
                    buf.extend_from_slice(piece);
                    while let Some(data) = decoder.next(&mut buf).unwrap() {
                        got.extend_from_slice(&data);
                    }
                }
                prop_assert!(decoder.done());
                prop_assert_eq!(got, body);
                prop_assert_eq!(&buf[..], b"REST");
            }

            /// Any bytes: the response parser and the chunk reader answer
            /// (never panic), and a parsed head is within the bytes given.
            #[test]
            fn the_response_parser_and_chunk_reader_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                if let Ok(Some(head)) = parse_response(&bytes) {
                    prop_assert!(head.len <= bytes.len());
                }
                let mut decoder = Chunked::default();
                let mut buf = BytesMut::from(&bytes[..]);
                for _ in 0..64 {
                    match decoder.next(&mut buf) {
                        Ok(Some(_)) => {}
                        _ => break,
                    }
                }
            }
        }
    }
}
