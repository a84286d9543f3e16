//! HTTP/1.1 towards the upstream without hyper's client: the request head
//! written in one pass into one buffer, the response head parsed once, and
//! the response body relayed by its framing, all with the HTTP/1.1 codec
//! ([`crate::http1`]); what is the client's own is here: the request head
//! with what keygate adds, the largest response head read, and the errors
//! the proxy answers for.
//!
//! Used for requests whose body is read whole before they are forwarded
//! (the lean path's, with their head, [`crate::listener::h1fast`]; small
//! bodies on hyper's path, [`super::buffering`]); streamed bodies keep
//! hyper's client.
//! What it saves is hyper's client dispatch for every such request: a channel
//! send and receive, a oneshot for the answer, and the wakes between them
//! (BENCHMARKS.md, "The lean HTTP/1.1 path").
//!
//! The response is read as hyper's client reads it, so that either client
//! gives the proxy the same response ([`crate::http1::response`], RFC 9112
//! section 6.3). A connection goes back to its pool only when the response
//! said nothing against it (`Connection: close`, HTTP/1.0 without
//! `keep-alive`), its body was read to its end, and nothing followed the body.

use http::{HeaderMap, header};

use super::headers::Added;
use crate::http1::{ChunkError, HeadError, write};

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

impl From<HeadError> for WireError {
    fn from(HeadError(why): HeadError) -> WireError {
        WireError::Head(why)
    }
}

impl From<ChunkError> for WireError {
    fn from(ChunkError(why): ChunkError) -> WireError {
        WireError::Chunk(why)
    }
}

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
    write::request_line(method, path_and_query, out);
    for (name, value) in headers {
        write::header_line(name, value, out);
    }
    added.each(|name, value| write::header_line(name, value, out));
    if body_len > 0 && !headers.contains_key(header::CONTENT_LENGTH) {
        write::content_length_line(body_len as u64, out);
    }
    write::end_head(out);
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

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
    fn codec_errors_keep_their_reason_as_the_proxy_reports_them() {
        assert_eq!(
            WireError::from(HeadError("too large")).to_string(),
            "invalid upstream response head: too large"
        );
        assert_eq!(
            WireError::from(ChunkError("bare LF")).to_string(),
            "invalid chunk in the upstream response: bare LF"
        );
    }
}
